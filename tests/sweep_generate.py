#!/usr/bin/env python3
"""A randomised differential sweep of `eaglegen generate` (make sweep; not part of make test).

Every sample's bits are a function of the model, the prompt, the sampling parameters, the
seed and the drafter (with its --draft-tokens); never of how the run was laid out or
scheduled. So each family (sampling parameters, seed, mode, drafter) gets a reference run
at a base configuration, and then random variants of everything that must not matter:
--ep / --ep-split / --stages (counts, cuts inside a layer) / --micro-batches / --batch /
--chunk / --kv-tokens small enough to preempt (to host memory or, with --host-kv-gb 0,
recomputed) / --kv-policy / --threads / --shard-samples, a kill -9 and resume, several
workers merged. Each variant's dataset must pass `inspect --verify` and hold samples
bit-identical to its reference's (tests/gen_check.py same); greedy with a drafter must equal greedy without one; and every
reference row must equal, bit for bit, `eaglegen forward`'s teacher-forced pass over the
sample's tokens (gen_check.py forward-exact). The
generator only draws combinations the engine accepts, so any failed run is a finding.

  sweep_generate.py [--seed S] [--families N] [--variants V] [--emu]

--emu: the CUDA backend on the CPU emulator ($EAGLEGEN is tests/gpu/emu's eaglegen_emu;
smaller runs, emulated GPUs for --ep / --stages over emulated NCCL, cuda-local on one GPU,
CUDA graphs on and off, the device sampler or its sort path): the emulator's kernels are
batch-invariant, so its variants must be bit-identical too (docs/CUDA.md).

Environment: EAGLEGEN (the binary), PYTHON (for gen_check.py; default /usr/bin/python3),
SWEEP_DIR (work directory, default a temporary one, kept on failure). Exit 1 on any
difference, failure or hang, each printed with the command that shows it."""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
E = os.path.abspath(os.environ.get("EAGLEGEN") or os.path.join(HERE, "..", os.environ.get("BUILD", "build"), "eaglegen"))
PY = os.environ.get("PYTHON", "/usr/bin/python3")
CHECK = os.path.join(HERE, "gen_check.py")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--families", type=int, default=20)
    ap.add_argument("--variants", type=int, default=3)
    ap.add_argument("--emu", action="store_true")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    W = os.environ.get("SWEEP_DIR") or tempfile.mkdtemp(prefix="eg-sweep-")
    os.makedirs(W, exist_ok=True)
    W = os.path.abspath(W)
    os.chdir(W)  # the commands printed name its files relatively
    print(f"sweep: {E} in {W}", flush=True)
    emu = a.emu
    timeout = 900 if emu else 300

    def sh(*cmd, env=None):
        r = subprocess.run(list(cmd), capture_output=True, text=True, env=env)
        if r.returncode:
            sys.exit(f"setup failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")

    # the fixture: a tiny model (layer 0 dense, 16 routed experts top-4), two drafters
    # for it (SpecForge's layout and vLLM's MLA one), prompts of very different lengths
    layers = 3 if emu else 5
    model = "model"
    sh(E, "mkmodel", "--preset", "tiny", "--out", model, "--layers", str(layers), "--seed", "7")
    aux = "0,1,2" if emu else "0,2,3"
    drafters = []
    for name, extra in (("drafter", []), ("drafter_mla", ["--mla", "--seed", "3"])):
        sh(E, "mkmodel", "--drafter-for", model, "--out", name, "--aux-layers", aux, *extra)
        drafters.append(name)
    n_prompts = 4 if emu else 12
    with open("corpus.jsonl", "w") as f:
        for i in range(n_prompts):
            f.write(json.dumps({"id": f"r{i}", "prompt": f"Record {i}: tell me about {i * 7}." +
                                " more" * (i * i // (6 if emu else 3))}) + "\n")
    with open("conv.jsonl", "w") as f:
        for i in range(3 if emu else 6):
            f.write(json.dumps({"id": f"c{i}", "messages": [
                {"role": "user", "content": f"Add {i} and 2." + " x" * ((4 if emu else 20) * i)},
                {"role": "assistant", "content": f"{i + 2}." + " y" * ((2 if emu else 9) * i)},
                {"role": "user", "content": "Thanks"}, {"role": "assistant", "content": "You are welcome."}]}) + "\n")
    with open("bad.jsonl", "w") as f:  # for --on-bad-record skip: two good records around three bad ones
        f.write(json.dumps({"id": "b0", "prompt": "Fine."}) + "\n")
        f.write("{not json\n")
        f.write(json.dumps({"id": "b2", "prompt": "x" * 4000}) + "\n")  # over --max-seq-len
        f.write(json.dumps({"id": "b3"}) + "\n")
        f.write(json.dumps({"id": "b4", "messages": [{"role": "user", "content": "Hi"},
                            {"role": "assistant", "content": "Hello."}]}) + "\n")
    seq = 192 if emu else 384  # emulated: under 256 positions, where the MLA split is batch-invariant (docs/ENGINE.md)
    base_env = dict(os.environ)
    if emu:
        base_env.update({"EMU_MEM_GB": "2", "EMU_DEVICES": "1"})

    def run(args, out, env, kill_after=None):
        cmd = [E, "generate"] + args + ["--out", out]
        if kill_after is not None:
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            time.sleep(kill_after)
            p.send_signal(signal.SIGKILL)
            p.wait()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        return r.returncode, r.stderr

    def family():
        capture = rng.random() < 0.15
        fam = {"capture": capture, "seed": rng.randrange(100), "max_new": rng.choice([4, 8] if emu else [8, 48, 100]),
               "temp": rng.choice([0, 0.8, 3, 10, 50]), "top_p": rng.choice([1, 0.9, 0.5]),
               "top_k": rng.choice([0, 0, 20, 1]), "draft": None, "k": 0}
        if not capture and rng.random() < 0.5:  # high temperatures: a random drafter is often right
            fam["draft"] = rng.choice(drafters)
            fam["k"] = rng.choice([1, 2, 3, 5])
        args = ["--model", model, "--max-seq-len", str(seq), "--aux-layers", aux, "--seed", str(fam["seed"])]
        # what the data holds, the same for the reference and its variants
        if rng.random() < 0.3:
            args += ["--final-hidden", rng.choice(["post-norm", "pre-norm"])]
        if rng.random() < 0.2:
            args += ["--thinking", "off"]
        if not capture and rng.random() < 0.2:
            args += ["--drop-truncated"]
        if rng.random() < 0.2:  # a bad record in the corpus, logged and skipped
            args += ["--on-bad-record", "skip"]
            fam["bad"] = True
        if emu:
            args += ["--backend", "cuda", "--gpu-mem-fraction", "0.4"]
        if capture:
            args += ["--prompts", "conv.jsonl", "--mode", "capture"]
        else:
            args += ["--prompts", "corpus.jsonl", "--max-new-tokens", str(fam["max_new"]),
                     "--temperature", str(fam["temp"]), "--top-p", str(fam["top_p"]), "--top-k", str(fam["top_k"])]
            if fam["draft"]:
                args += ["--draft-model", fam["draft"], "--draft-tokens", str(fam["k"])]
        if fam.get("bad"):
            args.insert(args.index("--prompts") + 2, "bad.jsonl")
        return fam, args

    def variant(fam):
        v, env, note = [], dict(base_env), []
        ep = rng.choice([1, 1, 2] if emu else [1, 1, 2, 4])
        stages = rng.choice([1, 1, 2] if emu else [1, 1, 2, 3, "cut"])
        if ep > 1:
            v += ["--ep", str(ep)]
            if rng.random() < 0.4:
                v += ["--ep-split", rng.choice(["ffn", "all"])]
        if stages == "cut":  # end inside a MoE layer (layer 0 is dense): experts 0..c-1 before the cut
            end = rng.randrange(2, layers)
            v += ["--stages", f"{end}:{rng.randrange(1, 16)},{layers}"]
        elif stages > 1:
            v += ["--stages", str(stages)]
            if rng.random() < 0.3:
                v += ["--micro-batches", str(rng.choice([1, 2, 3]))]
        if emu:
            gpus = ep * (stages if stages != "cut" else 2)
            if gpus > 1 and rng.random() < 0.5:
                env["EMU_DEVICES"] = str(gpus)  # one emulated GPU per rank and stage: NCCL
                note.append(f"EMU_DEVICES={gpus}")
            elif ep > 1:
                env["EG_EP_EXCHANGE"] = "cuda-local"
                note.append("EG_EP_EXCHANGE=cuda-local")
                if stages != 1:
                    v += ["--gpus", "1"]
            elif stages != 1:
                v += ["--gpus", "1"]
            if rng.random() < 0.3:
                env["EG_CUDA_GRAPHS"] = "0"
                note.append("EG_CUDA_GRAPHS=0")
            if rng.random() < 0.2:
                env["EG_CUDA_SAMPLE"] = "sort"
                note.append("EG_CUDA_SAMPLE=sort")
        b = rng.choice([x for x in [1, 2, 3, 4, 5, 8] if x >= ep])
        c = rng.choice([3, 5, 16, 64, 512] if emu else [1, 2, 3, 5, 8, 16, 64, 512])  # emulated steps are slow
        auto = rng.random() < 0.1  # as many slots as the pool holds, at most --chunk
        if fam["k"] and (c if auto else max(b, c)) < fam["k"] + 1:  # a verify step of k + 1 rows must fit
            c = fam["k"] + 1 + rng.randrange(3)
        v += ["--batch", "auto" if auto else str(b), "--chunk", str(c)]
        r = rng.random()
        if r < 0.3:  # a pool each rank's share of which holds one sequence: preemptions
            v += ["--kv-tokens", str(ep * (seq + rng.choice([0, 16, 128, 416])))]
            if rng.random() < 0.5:
                v += ["--host-kv-gb", "0"]  # preempted caches recomputed, not swapped
        elif r < 0.4:
            v += ["--kv-policy", "reserve"]
        if not emu:
            v += ["--threads", str(rng.choice([1, 2]))]
        if rng.random() < 0.3:
            v += ["--shard-samples", str(rng.choice([1, 3, 5]))]
        return v, env, note

    def ledger(d):  # the records set aside (bad, dropped; in completion order, so sorted), without their raw text
        try:
            with open(os.path.join(d, "rejects.jsonl")) as f:
                rows = [json.loads(x) for x in f if x.strip()]
        except FileNotFoundError:
            return []
        return sorted((x.get("index"), x.get("outcome"), x.get("file"), x.get("line"), x.get("reason")) for x in rows)

    failures = []
    ran = 0
    for it in range(a.families):
        fam, ba = family()
        ref = "ref"
        shutil.rmtree(ref, ignore_errors=True)
        rc, err = run(ba + ["--batch", "4", "--chunk", "16"], ref, base_env)
        if rc:
            failures.append(f"[{it}] the reference failed (rc {rc}): {' '.join(ba)}\n{err[-1500:]}")
            print(failures[-1], flush=True)
            continue
        # the reference's rows are a teacher-forced pass over its tokens, bit for bit
        fwd = [E, "forward", "--model", model, "--prompts", "fw.json", "--out", "fw.safetensors",
               "--chunk", str(rng.choice([5, 64, 256]))] + (["--backend", "cuda"] if emu else [])
        steps = [[PY, CHECK, "export-prompts", ref, "1000", "fw-ids.json", "fw.json"], fwd,
                 [PY, CHECK, "forward-exact", ref, "fw-ids.json", "fw.safetensors"]]
        for k, cmd in enumerate(steps):
            if k == 1 and not json.load(open("fw-ids.json")):
                break  # every sample dropped (--drop-truncated): nothing to teacher-force
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=base_env)
            if r.returncode:
                failures.append(f"[{it}] the reference is not its teacher-forced pass: {' '.join(ba)}\n"
                                f"  {' '.join(cmd)}\n{r.stdout[-800:]}{r.stderr[-800:]}")
                print(failures[-1], flush=True)
                break
        if fam["temp"] == 0 and fam["draft"]:  # greedy with a drafter == greedy without one
            plain = list(ba)
            i = plain.index("--draft-model")
            del plain[i:i + 4]
            p0 = "plain"
            shutil.rmtree(p0, ignore_errors=True)
            rc, err = run(plain + ["--batch", "4", "--chunk", "16"], p0, base_env)
            r = subprocess.run([PY, CHECK, "same", p0, ref], capture_output=True, text=True)
            if rc or r.returncode:
                failures.append(f"[{it}] greedy with the drafter differs from greedy without: {' '.join(ba)}\n"
                                f"{r.stdout[-500:]}{err[-500:]}")
                print(failures[-1], flush=True)
        for j in range(a.variants):
            va, env, note = variant(fam)
            out = "v"
            for d in [out] + [f"{out}_w{k}" for k in range(1, 4)]:
                shutil.rmtree(d, ignore_errors=True)
            kill = rng.choice([0.3, 1.0, 3.0]) if rng.random() < 0.2 else None
            workers = rng.choice([2, 3]) if kill is None and rng.random() < 0.15 else 0
            desc = " ".join(note + ["eaglegen generate"] + ba + va)
            try:
                if workers:  # workers into one directory or their own, then merged
                    dirs = [out]
                    for w in range(workers):
                        d = out if w == 0 or rng.random() < 0.5 else f"{out}_w{w}"
                        if d not in dirs:
                            dirs.append(d)
                        rc, err = run(ba + va + ["--worker", f"{w}/{workers}"], d, env)
                        if rc:
                            break
                    if not rc:
                        m = subprocess.run([E, "merge"] + dirs + ["--out", out], capture_output=True, text=True)
                        rc, err = m.returncode, m.stderr
                    desc += f"  [{workers} workers, merged]"
                else:
                    rc, err = run(ba + va, out, env, kill_after=kill)
                    if kill is not None:
                        desc += f"  [killed after {kill} s, resumed]"
            except subprocess.TimeoutExpired:
                failures.append(f"[{it}.{j}] no answer in {timeout} s: {desc}")
                print(failures[-1], flush=True)
                continue
            ran += 1
            if rc:
                failures.append(f"[{it}.{j}] failed (rc {rc}): {desc}\n{err[-1500:]}")
                print(failures[-1], flush=True)
                continue
            r = subprocess.run([E, "inspect", out, "--verify"], capture_output=True, text=True)
            if r.returncode:
                r.stdout = "inspect --verify: " + r.stdout[-600:] + r.stderr[-600:]
            else:
                r = subprocess.run([PY, CHECK, "same", ref, out], capture_output=True, text=True)
            if not r.returncode and not workers and ledger(ref) != ledger(out):
                r.returncode, r.stdout = 1, f"rejects.jsonl differs:\n  {ledger(ref)}\n  {ledger(out)}"
            if r.returncode:
                keep = f"differs-{it}-{j}"
                shutil.copytree(out, keep)
                shutil.copytree(ref, keep + "-ref")
                failures.append(f"[{it}.{j}] differs from its reference ({keep}): {desc}\n{r.stdout[-800:]}")
                print(failures[-1], flush=True)
            else:
                print(f"[{it}.{j}] identical: {desc}", flush=True)
    print(f"sweep (seed {a.seed}{', emulator' if emu else ''}): {a.families} families, {ran} variants run, "
          f"{len(failures)} findings{'; work directory ' + W if failures else ''}")
    if not failures and not os.environ.get("SWEEP_DIR"):
        shutil.rmtree(W, ignore_errors=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
