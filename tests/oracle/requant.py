# SPDX-License-Identifier: MIT
"""Write a copy of a GGUF model with every matrix in another tensor type.

    requant.py IN OUT TYPE     (TYPE: F32 F16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1)

Test data only (hyb never runs Python): the real-weights tests derive their
variants of a real model with it. Matrices (2-D tensors) are dequantized
with the gguf package and quantized again to TYPE, with gguf's port of
llama.cpp's reference quantizers; 1-D tensors (norms) and the metadata are
copied unchanged, so llama.cpp and hyb read the same file.
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType as T, GGUFReader, GGUFWriter, GGUFValueType
from gguf.quants import dequantize, quantize

TYPES = {n: T[n] for n in ("F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")}


def copy_fields(r, w):
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name in ("general.architecture", "general.file_type"):
            continue
        vt = f.types[0]
        if vt == GGUFValueType.ARRAY:
            w.add_key_value(f.name, f.contents(), vt, sub_type=f.types[-1])
        else:
            w.add_key_value(f.name, f.contents(), vt)


def main():
    if len(sys.argv) != 4 or sys.argv[3] not in TYPES:
        sys.exit("usage: requant.py IN OUT " + "|".join(TYPES))
    src, dst, qt = sys.argv[1], sys.argv[2], TYPES[sys.argv[3]]
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    copy_fields(r, w)
    w.add_file_type(int({"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8,
                         "Q5_1": 9}[sys.argv[3]]))
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]  # numpy order: rows first
        if len(shape) < 2:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
            continue
        x = dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if qt == T.F32:
            w.add_tensor(t.name, x)
        elif qt == T.F16:
            w.add_tensor(t.name, x.astype(np.float16))
        else:
            q = quantize(x, qt)
            w.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
