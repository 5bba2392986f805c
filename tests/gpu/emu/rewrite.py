#!/usr/bin/env python3
"""Turn a kernels/*.cu file into host C++ for the emulator: `k<<<g, b, shm, s>>>(args);`
becomes `emu_launch(dim3(g), dim3(b), shm, s, <k(args) with args bound by value>);` and `extern __shared__
T name[];` a pointer into the launch's dynamic shared buffer.
usage: rewrite.py IN.cu OUT.cpp"""
import re
import sys


def split_top(s):
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([{<" and ch != "<":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def main():
    src = open(sys.argv[1]).read()
    src = re.sub(r"extern\s+__shared__\s+(\w+)\s+(\w+)\s*\[\s*\]\s*;",
                 r"\1 *\2 = (\1 *)emu_dyn_smem;", src)
    # static __shared__ arrays become process-wide statics: poison each one the first time
    # a block reaches its declaration, as a GPU gives a block garbage shared memory
    src = re.sub(r"(^[ \t]*__shared__\s[^;{}]*?\b([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*;)",
                 r"\1 emu_poison_shared(&\2, sizeof \2);", src, flags=re.M)
    pat = re.compile(r"([A-Za-z_][\w:]*(?:<[^;<>]*>)?)\s*<<<(.*?)>>>\s*\((.*?)\)\s*;", re.S)

    def repl(m):
        cfg = split_top(m.group(2))
        grid, block = cfg[0], cfg[1]
        shm = cfg[2] if len(cfg) > 2 else "0"
        stream = cfg[3] if len(cfg) > 3 else "0"
        args = re.sub(r"\bNULL\b", "nullptr", m.group(3))  # forwarded, a NULL would be a long
        # the arguments are evaluated now and kept by value: a recorded launch (stream
        # capture) runs after the launcher's locals are gone
        return (f"emu_launch(reinterpret_cast<const void *>(&{m.group(1)}), dim3({grid}), dim3({block}), "
                f"(size_t)({shm}), (cudaStream_t)({stream}), "
                f"emu_bind({m.group(1)}{', ' if args.strip() else ''}{args}));")

    src, n = pat.subn(repl, src)
    open(sys.argv[2], "w").write(f"// generated from {sys.argv[1]} by tests/gpu/emu/rewrite.py ({n} launches)\n" + src)


if __name__ == "__main__":
    main()
