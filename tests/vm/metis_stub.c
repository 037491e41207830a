// SPDX-License-Identifier: MIT
/*
 * The VM bench links its programs statically and Debian ships METIS as a
 * shared library only. Nothing in the VM partitions a graph (hybctl plan is
 * tested on the host), so these stand in for it: a call says METIS_ERROR and
 * plan/group.c reports "METIS failed" rather than the link failing.
 */
#include <metis.h>

int METIS_SetDefaultOptions(idx_t *options)
{
	for (int i = 0; i < METIS_NOPTIONS; i++)
		options[i] = -1;
	return METIS_OK;
}

int METIS_PartGraphKway(idx_t *nvtxs, idx_t *ncon, idx_t *xadj, idx_t *adjncy, idx_t *vwgt,
			idx_t *vsize, idx_t *adjwgt, idx_t *nparts, real_t *tpwgts, real_t *ubvec,
			idx_t *options, idx_t *edgecut, idx_t *part)
{
	(void)nvtxs, (void)ncon, (void)xadj, (void)adjncy, (void)vwgt, (void)vsize;
	(void)adjwgt, (void)nparts, (void)tpwgts, (void)ubvec, (void)options, (void)edgecut;
	(void)part;
	return METIS_ERROR;
}

int METIS_PartGraphRecursive(idx_t *nvtxs, idx_t *ncon, idx_t *xadj, idx_t *adjncy,
			     idx_t *vwgt, idx_t *vsize, idx_t *adjwgt, idx_t *nparts,
			     real_t *tpwgts, real_t *ubvec, idx_t *options, idx_t *edgecut,
			     idx_t *part)
{
	return METIS_PartGraphKway(nvtxs, ncon, xadj, adjncy, vwgt, vsize, adjwgt, nparts, tpwgts,
				   ubvec, options, edgecut, part);
}
