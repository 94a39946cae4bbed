"""Compile every kernel for a CUDA target without a GPU (Triton's bundled ptxas), and read the SASS.

The interpreter accepts code the compiler rejects (and runs it one program at a time), so CI on a machine
with no GPU compiles each kernel for Hopper too. It also answers, without device time, whether the page
kernels use 16-byte accesses (``LDG.E.128``/``STG.E.128``), which memory-bound copies need to approach the
copy ceiling (HOPPER.md). Pointer and size arguments are marked 16-divisible as the JIT marks them for the
aligned pages and tables of a real arena.

    python -m kvarena.gpu.kernels.aot [--arch 90]   # must run WITHOUT TRITON_INTERPRET=1

Prints one JSON line per kernel: name, cubin bytes, the widest global load / store in SASS (or PTX).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import triton


def _compile(fn: object, sig: dict[str, str], consts: dict[str, object], aligned: list[str], arch: int,
             num_warps: int) -> object:
    from triton.backends.compiler import GPUTarget

    names = fn.arg_names  # type: ignore[attr-defined]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    src = triton.compiler.ASTSource(fn=fn, signature={**sig, **dict.fromkeys(consts, "constexpr")},
                                    constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})


def _widest(text: str, op: str) -> int:
    """Widest access in bits of SASS op ``LDG``/``STG`` (falls back to PTX ld/st.global)."""
    sass = re.findall(rf"{op}\.E(?:\.\w+)*?\.(64|128)\b", text)
    if sass:
        return max(int(b) for b in sass)
    ptx_op = "ld" if op == "LDG" else "st"
    best = 0
    for vec, bits in re.findall(rf"{ptx_op}\.global(?:\.\w+)*?(?:\.v(\d))?\.b(\d+)", text):
        best = max(best, int(vec or 1) * int(bits))
    return best


def _sass(cubin: bytes) -> str | None:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    tool_path = str(tool) if tool.exists() else shutil.which("cuobjdump")
    if not tool_path:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool_path, "--dump-sass", f.name], capture_output=True, text=True, check=False)
    return out.stdout or None


def compile_all(arch: int = 90) -> list[dict]:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")
    from kvarena.gpu.kernels import alloc, move, translate, zero

    p64 = "*i64"
    jobs = [
        ("move_pages", move.move_pages_kernel, {"words_ptr": p64, "src_ptr": p64, "dst_ptr": p64, "page_words": "i32",
                                                "chunks": "i32", "vids_ptr": p64, "v2p_ptr": p64, "p2v_ptr": p64},
         {"BLOCK": 4096, "REMAP": True}, ["words_ptr", "src_ptr", "dst_ptr", "page_words"], 8),
        ("zero_pages", zero.zero_pages_kernel, {"words_ptr": p64, "slots_ptr": p64, "page_words": "i32",
                                                "chunks": "i32", "skip": "i64"}, {"BLOCK": 4096},
         ["words_ptr", "slots_ptr", "page_words"], 8),
        ("translate", translate.translate_kernel, {"vtok_ptr": p64, "out_ptr": p64, "v2p_ptr": p64, "n": "i32",
                                                   "n_vids": "i32", "n_out": "i32", "pad": "i64"},
         {"EPP": 64, "BLOCK": 4096},
         ["vtok_ptr", "out_ptr", "v2p_ptr", "n"], 16),
    ]
    asig = {n: p64 for n in ("pre_ptr", "seq_ptr", "last_ptr", "vids_ptr", "slots_ptr", "out_ptr", "v2p_ptr",
                             "p2v_ptr")} | {"bs": "i32", "n_pages": "i32"}
    for decode, (br, bt) in ((True, (1024, 1)), (False, (16, 256)), (False, (1, 1024))):
        jobs.append((f"alloc_tokens[{'decode' if decode else 'extend'} {br}x{bt}]", alloc.alloc_tokens_kernel, asig,
                     {"EPP": 64, "DECODE": decode, "WRITE_OUT": True, "BLOCK_R": br, "BLOCK_T": bt, "SCAN": 1024},
                     list(asig)[:-2], 4))
    out = []
    for name, fn, sig, consts, aligned, warps in jobs:
        k = _compile(fn, sig, consts, aligned, arch, warps)
        text = _sass(k.asm["cubin"]) or k.asm["ptx"]
        out.append({"kernel": name, "arch": f"sm_{arch}", "cubin_bytes": len(k.asm["cubin"]),
                    "widest_load_bits": _widest(text, "LDG"), "widest_store_bits": _widest(text, "STG"),
                    "from": "sass" if "LDG" in text or "STG" in text else "ptx"})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", type=int, default=90)
    args = p.parse_args(argv)
    for row in compile_all(args.arch):
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
