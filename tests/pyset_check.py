"""SpecForge's draft-vocab padding: eaglegen's simulation (test_dataset_vocab --pyset) against the
running CPython's own set(range(N)) - seen iteration, as process_token_dict_to_mappings uses it."""
import random, subprocess, sys
exe = sys.argv[1]
rng = random.Random(7)
nonasc = 0
cases = [(32000, 20000, 3000), (32000, 30000, 500), (1000, 700, 50), (64, 40, 5), (5000, 1200, 0), (163840, 31000, 900)]
for _ in range(40):
    N = rng.randrange(16, 40000)
    cases.append((N, rng.randrange(N // 4, N), rng.randrange(0, 200)))
for N, a, b in cases:
    low = rng.sample(range(N), min(a, N - 1))   # seen ids below N (dense: most frequent ids are low)
    high = rng.sample(range(N, N + 10 * b + 10), b)
    seen = low + high
    if len(seen) >= N:
        continue
    existing = set(seen)
    missing = set(range(N)) - existing       # SpecForge's process_token_dict_to_mappings, verbatim logic
    need = N - len(existing)
    want, have = [], len(existing)
    for t in missing:
        want.append(t)
        have += 1
        if have >= N:
            break
    out = subprocess.run([exe, "--pyset"], input=f"{N} {need} " + " ".join(map(str, seen)), capture_output=True,
                         text=True, check=True).stdout.split()
    got = [int(x) for x in out]
    assert got == want, (N, a, b, got[:10], want[:10])
    nonasc += want != sorted(want) or want != sorted(missing)[:need]
print(f"pyset: {len(cases)} cases equal CPython's set order ({nonasc} where it is not the lowest ids ascending)")
assert nonasc > 0
