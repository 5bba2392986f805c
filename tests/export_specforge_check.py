"""Checks an `eaglegen export --to specforge` directory without torch (numpy only).

usage: export_specforge_check.py DATASET OUT [--max-len N] [--tie eaglegen|specforge] [--draft-vocab N]

Reads every .ckpt (and vocab_mapping.pt) as torch.load would: the zip members
(names, stored, 64-byte aligned data, CRCs), the pickle run opcode by opcode
(pickletools) and unpickled with torch's globals mapped to numpy builders, then
compares every tensor with eaglegen's own reader (dataset/python/eaglegen_data.py).
The draft vocabulary is recomputed here from the samples with SpecForge 0.2.0's
generate_vocab_mapping_file / process_token_dict_to_mappings rule (Counter filled
sample by sample, most_common, padding from set(range(N)) - seen), or eaglegen's.
"""
import collections
import io
import json
import os
import pickle
import pickletools
import sys
import zipfile

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "dataset", "python"))
import eaglegen_data as eg  # noqa: E402

STORAGE = {"LongStorage": "<i8", "IntStorage": "<i4", "ByteStorage": "u1", "BoolStorage": "?",
           "BFloat16Storage": "<u2", "FloatStorage": "<f4"}


class Storage:
    def __init__(self, name):
        self.name = name


def load_pt(path):
    """torch.load without torch: dict name -> (storage type name, numpy array)."""
    z = zipfile.ZipFile(path)
    assert z.testzip() is None, f"{path}: CRC mismatch"
    names = z.namelist()
    assert names[0] == "archive/data.pkl" and names[1] == "archive/byteorder" and names[-1] == "archive/version", names
    assert z.read("archive/byteorder") == b"little" and z.read("archive/version") == b"3\n"
    raw = open(path, "rb").read()
    for info in z.infolist():
        assert info.compress_type == zipfile.ZIP_STORED, (path, info.filename)
        if info.filename.startswith("archive/data/"):
            nl, xl = np.frombuffer(raw[info.header_offset + 26: info.header_offset + 30], "<u2")
            off = info.header_offset + 30 + nl + xl
            assert off % 64 == 0, f"{path}: {info.filename} data at {off}, not 64-aligned"
    pk = z.read("archive/data.pkl")
    out = io.StringIO()
    pickletools.dis(pk, out=out)  # raises on a malformed pickle
    ops = [l.split()[2] for l in out.getvalue().splitlines() if ":" in l[:12]]
    assert ops[0] == "PROTO" and ops[-1] == "STOP", ops[:3]

    def rebuild(storage, offset, size, stride, requires_grad, hooks):
        name, arr = storage
        assert offset == 0 and requires_grad is False and isinstance(hooks, collections.OrderedDict) and not hooks
        n = int(np.prod(size)) if size else 1
        exp = tuple(int(np.prod(size[i + 1:])) for i in range(len(size)))
        assert tuple(stride) == exp, (stride, exp)
        assert arr.size == n
        return name, arr.reshape(size)

    class U(pickle.Unpickler):
        def find_class(self, mod, name):
            if (mod, name) == ("torch._utils", "_rebuild_tensor_v2"):
                return rebuild
            if (mod, name) == ("collections", "OrderedDict"):
                return collections.OrderedDict
            if mod == "torch" and name in STORAGE:
                return Storage(name)
            raise AssertionError(f"{path}: global {mod}.{name} not allowed by torch's weights_only loader")

        def persistent_load(self, pid):
            typ, st, key, loc, numel = pid
            assert typ == "storage" and loc == "cpu" and isinstance(st, Storage), pid
            a = np.frombuffer(z.read(f"archive/data/{key}"), dtype=STORAGE[st.name])
            assert a.size == numel, (pid, a.size)
            return st.name, a

    d = U(io.BytesIO(pk)).load()
    assert isinstance(d, dict)
    return d


def specforge_mapping(samples, N, V):
    """SpecForge 0.2.0 generate_vocab_mapping_file + process_token_dict_to_mappings, numpy for torch."""
    token_dict = collections.Counter()
    for ids, mask in samples:
        masked = ids[mask == 1]
        u, c = np.unique(masked, return_counts=True)  # torch.unique: sorted
        token_dict.update(dict(zip(u.tolist(), c.tolist())))
    if len(token_dict) < N:
        existing = set(token_dict.keys())
        missing = set(range(N)) - existing
        for t in missing:
            token_dict[t] = 0
            if len(token_dict) >= N:
                break
    used = sorted(k for k, _ in token_dict.most_common(N))
    d2t = np.array([used[i] - i for i in range(len(used))], dtype=np.int64)
    t2d = np.array([i in set(used) for i in range(V)], dtype=bool)
    return d2t, t2d


def eaglegen_mapping(hist, N, V):
    order = sorted(hist, key=lambda k: (-hist[k], k))[:N]
    sel = set(order)
    k = 0
    while len(sel) < N:
        if k not in sel:
            sel.add(k)
        k += 1
    used = sorted(sel)
    return (np.array([used[i] - i for i in range(N)], dtype=np.int64),
            np.array([i in sel for i in range(V)], dtype=bool))


def main():
    a = sys.argv[1:]
    ds_path, out = a[0], a[1]
    opt = dict(zip(a[2::2], a[3::2]))
    max_len = int(opt.get("--max-len", 0)) or None
    tie = opt.get("--tie", "eaglegen")
    ds = eg.EagleGenDataset(ds_path, as_torch=False)
    m = ds.manifest
    V = m["tokenizer"]["vocab_size"]
    N = int(opt.get("--draft-vocab", min(V, 32000)))
    samples = []
    for i in range(len(ds)):
        r = ds.read_raw(i)
        T = len(r["input_ids"])
        n = T if max_len is None else min(T, max_len)
        p = os.path.join(out, "hidden_states", f"rows_{i // 2000 * 2000}-{i // 2000 * 2000 + 2000}", f"data_{i}.ckpt")
        d = load_pt(p)
        assert list(d) == ["input_ids", "loss_mask", "hidden_state", "aux_hidden_state"], (p, list(d))
        H, A = ds.hidden_size, ds.n_aux
        for k, (typ, shape) in {"input_ids": ("LongStorage", (n,)), "loss_mask": ("LongStorage", (n,)),
                                "hidden_state": ("BFloat16Storage", (1, n, H)),
                                "aux_hidden_state": ("BFloat16Storage", (1, n, A * H))}.items():
            assert d[k][0] == typ and d[k][1].shape == shape, (p, k, d[k][0], d[k][1].shape)
        assert np.array_equal(d["input_ids"][1], r["input_ids"][:n].astype(np.int64)), p
        assert np.array_equal(d["loss_mask"][1], r["loss_mask"][:n].astype(np.int64)), p
        assert np.array_equal(d["hidden_state"][1][0], r["final_hidden"][:n]), f"{p}: hidden_state != post-norm final"
        assert np.array_equal(d["aux_hidden_state"][1][0], r["aux_hidden"][:n].reshape(n, A * H)), p
        if r["final_pre_hidden"] is not None:  # the post-norm state, not the pre-norm one
            assert not np.array_equal(d["hidden_state"][1][0], r["final_pre_hidden"][:n]), p
        samples.append((r["input_ids"][:n].astype(np.int64), r["loss_mask"][:n]))  # what the trainer is given
    files = [f for _, _, fs in os.walk(os.path.join(out, "hidden_states")) for f in fs]
    assert len(files) == len(ds) and all(f.endswith(".ckpt") for f in files), files

    vm = load_pt(os.path.join(out, "vocab_mapping.pt"))
    assert list(vm) == ["d2t", "t2d"], list(vm)
    assert vm["d2t"][0] == "LongStorage" and vm["d2t"][1].shape == (N,), vm["d2t"][0]
    assert vm["t2d"][0] == "BoolStorage" and vm["t2d"][1].shape == (V,), vm["t2d"][0]
    if tie == "specforge":
        d2t, t2d = specforge_mapping(samples, N, V)
    else:
        hist = collections.Counter()
        for ids, mask in samples:
            hist.update(ids[mask == 1].tolist())
        d2t, t2d = eaglegen_mapping(hist, N, V)
    assert np.array_equal(vm["d2t"][1], d2t), f"d2t differs from the {tie} rule"
    assert np.array_equal(vm["t2d"][1], t2d), f"t2d differs from the {tie} rule"
    other = eaglegen_mapping(collections.Counter(
        [t for ids, mask in samples for t in ids[mask == 1].tolist()]), N, V) if tie == "specforge" else None
    cfg = json.load(open(os.path.join(out, "draft_config.json")))
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    ids = m["aux_layers"]["trainer_ids"]["specforge_sglang"]["aux_ids"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids == m["aux_layers"]["ids"], cfg["eagle_config"]
    assert (cfg["hidden_size"], cfg["vocab_size"], cfg["draft_vocab_size"]) == (ds.hidden_size, V, N)
    assert cfg["num_attention_heads"] * cfg["head_dim"] == cfg["hidden_size"]
    mk = json.load(open(os.path.join(out, ".eaglegen-export.json")))
    assert mk["state"] == "complete", mk
    print(f"ok: {len(ds)} samples, draft vocab {N} ({tie}); "
          f"differs from eaglegen's rule: {other is not None and not np.array_equal(other[0], d2t)}")


if __name__ == "__main__":
    main()
