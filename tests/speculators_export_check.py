"""Checks an `eaglegen export --to speculators` folder against the eaglegen dataset it came
from, with numpy only (no torch, pyarrow or datasets): the Arrow IPC stream is parsed here
from the Arrow spec (flatbuffer tables read through their vtables), the safetensors headers
by hand, the .npy files with numpy.

usage: speculators_export_check.py DATASET EXPORT [--max-len N] [--draft-vocab N]

Checks: file names; the Arrow schema (input_ids / loss_mask list<int64>, seq_len int64,
the huggingface metadata), every row against the source sample (the samples with a
supervised token, in order, cut to --max-len); dataset_info.json and state.json as
`datasets` writes them; for each row hidden_states/hs_{i}.safetensors: keys, dtypes,
shapes, offsets, token_ids == input_ids, planes 0..n_aux-1 == the aux states and the last
plane == the PRE-norm final state (bit for bit), not the post-norm one; d2t/t2d: dtypes,
shapes, equal to speculators' own rule (build_vocab_mappings_from_distribution, written
out here) over the exported rows; the ids in eaglegen_export.json (k + 1, final = L)."""
import argparse
import json
import os
import struct
import sys

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "dataset", "python"))
import eaglegen_data as eg  # noqa: E402


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


# ------------------------------------------------------------------ flatbuffers (read side)
class Table:
    def __init__(self, buf, pos):
        self.buf, self.pos = buf, pos
        vt = pos - struct.unpack_from("<i", buf, pos)[0]
        self.vt_len, self.tbl_len = struct.unpack_from("<HH", buf, vt)
        self.vt = vt

    def _off(self, slot):
        o = 4 + 2 * slot
        if o >= self.vt_len:
            return 0
        return struct.unpack_from("<H", self.buf, self.vt + o)[0]

    def scalar(self, slot, fmt, default=0):
        o = self._off(slot)
        return struct.unpack_from("<" + fmt, self.buf, self.pos + o)[0] if o else default

    def _ref(self, slot):
        o = self._off(slot)
        if not o:
            return None
        p = self.pos + o
        return p + struct.unpack_from("<I", self.buf, p)[0]

    def table(self, slot):
        p = self._ref(slot)
        return Table(self.buf, p) if p is not None else None

    def string(self, slot):
        p = self._ref(slot)
        if p is None:
            return None
        n = struct.unpack_from("<I", self.buf, p)[0]
        return bytes(self.buf[p + 4 : p + 4 + n]).decode()

    def tables(self, slot):
        p = self._ref(slot)
        if p is None:
            return None
        n = struct.unpack_from("<I", self.buf, p)[0]
        out = []
        for i in range(n):
            q = p + 4 + 4 * i
            out.append(Table(self.buf, q + struct.unpack_from("<I", self.buf, q)[0]))
        return out

    def pairs(self, slot):  # vector of 16-byte structs (two int64)
        p = self._ref(slot)
        n = struct.unpack_from("<I", self.buf, p)[0]
        if (p + 4) % 8:
            fail("arrow: struct vector not 8-byte aligned")
        return [struct.unpack_from("<qq", self.buf, p + 4 + 16 * i) for i in range(n)]


def root(buf):
    return Table(buf, struct.unpack_from("<I", buf, 0)[0])


INT, LIST = 2, 12


def read_arrow_stream(path):
    """-> (fields [(name, kind)], metadata dict, columns {name: list of per-row values})."""
    data = open(path, "rb").read()
    p, schema, meta, rows = 0, None, {}, None
    while True:
        if p + 8 > len(data):
            fail(f"{path}: stream ends without the end-of-stream marker")
        cont, mlen = struct.unpack_from("<Ii", data, p)
        if cont != 0xFFFFFFFF:
            fail(f"{path}: message at {p} lacks the continuation marker")
        if mlen == 0:
            if p + 8 != len(data):
                fail(f"{path}: bytes after the end-of-stream marker")
            break
        if (p + 8 + mlen) % 8:
            fail(f"{path}: message at {p}: body not 8-byte aligned")
        fbuf = memoryview(data)[p + 8 : p + 8 + mlen]
        msg = root(fbuf)
        if msg.scalar(0, "h") != 4:
            fail(f"{path}: metadata version {msg.scalar(0, 'h')}, want V5 (4)")
        htype, body_len = msg.scalar(1, "B"), msg.scalar(3, "q")
        hdr = msg.table(2)
        body = memoryview(data)[p + 8 + mlen : p + 8 + mlen + body_len]
        p += 8 + mlen + body_len
        if htype == 1:
            if schema is not None:
                fail(f"{path}: two schemas")
            if hdr.scalar(0, "h") != 0:
                fail(f"{path}: not little-endian")
            schema = []
            for f in hdr.tables(1):
                tt, ch = f.scalar(2, "B"), f.tables(5)
                if ch is None:
                    fail(f"{path}: field {f.string(0)} has no children vector")
                if tt == INT:
                    t = f.table(3)
                    if (t.scalar(0, "i"), t.scalar(1, "B")) != (64, 1) or ch:
                        fail(f"{path}: field {f.string(0)} is not int64")
                    kind = "int64"
                elif tt == LIST:
                    if len(ch) != 1 or ch[0].scalar(2, "B") != INT or ch[0].string(0) != "item":
                        fail(f"{path}: field {f.string(0)}: list child is not int64 'item'")
                    t = ch[0].table(3)
                    if (t.scalar(0, "i"), t.scalar(1, "B")) != (64, 1):
                        fail(f"{path}: field {f.string(0)}: list of non-int64")
                    kind = "list<int64>"
                else:
                    fail(f"{path}: field {f.string(0)}: type {tt}")
                schema.append((f.string(0), kind))
            for kv in hdr.tables(2) or []:
                meta[kv.string(0)] = kv.string(1)
            rows = {n: [] for n, _ in schema}
        elif htype == 3:
            if schema is None:
                fail(f"{path}: record batch before the schema")
            n = hdr.scalar(0, "q")
            nodes, bufs = hdr.pairs(1), hdr.pairs(2)
            ni = bi = 0
            for name, kind in schema:

                def buf(k):
                    off, ln = bufs[k]
                    if off % 8:
                        fail(f"{path}: buffer {k} at {off} not 8-byte aligned")
                    return body[off : off + ln]

                if nodes[ni] != (n, 0):
                    fail(f"{path}: {name}: node {nodes[ni]}, want ({n}, 0)")
                if bufs[bi][1] != 0:
                    fail(f"{path}: {name}: a validity buffer although nothing is null")
                if kind == "int64":
                    v = np.frombuffer(buf(bi + 1), "<i8")
                    if v.size != n:
                        fail(f"{path}: {name}: {v.size} values for {n} rows")
                    rows[name].extend(int(x) for x in v)
                    ni, bi = ni + 1, bi + 2
                else:
                    off = np.frombuffer(buf(bi + 1), "<i4")
                    vals = np.frombuffer(buf(bi + 3), "<i8")
                    if off.size != n + 1 or off[0] != 0 or np.any(np.diff(off) < 0) or off[-1] != vals.size:
                        fail(f"{path}: {name}: bad offsets")
                    if nodes[ni + 1] != (vals.size, 0):
                        fail(f"{path}: {name}: child node {nodes[ni + 1]}")
                    rows[name].extend(vals[off[i] : off[i + 1]].copy() for i in range(n))
                    ni, bi = ni + 2, bi + 4
            if ni != len(nodes) or bi != len(bufs):
                fail(f"{path}: {len(nodes)} nodes / {len(bufs)} buffers, used {ni} / {bi}")
        else:
            fail(f"{path}: message type {htype}")
    return schema, meta, rows


def read_safetensors(path):
    data = open(path, "rb").read()
    (hl,) = struct.unpack_from("<Q", data, 0)
    if hl % 8:
        fail(f"{path}: header length {hl} not a multiple of 8")
    hdr = json.loads(data[8 : 8 + hl])
    out, end = {}, 0
    size = {"I64": 8, "BF16": 2}
    npdt = {"I64": "<i8", "BF16": "<u2"}
    for name, e in sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0] if kv[0] != "__metadata__" else -1):
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        if a != end or b - a != size[e["dtype"]] * int(np.prod(e["shape"])):
            fail(f"{path}: {name}: offsets {a}..{b} do not follow {end} / shape {e['shape']}")
        end = b
        out[name] = (e["dtype"], e["shape"], np.frombuffer(data[8 + hl + a : 8 + hl + b], npdt[e["dtype"]]).reshape(e["shape"]))
    if 8 + hl + end != len(data):
        fail(f"{path}: {len(data)} bytes, header accounts for {8 + hl + end}")
    return out


def speculators_vocab(counts, N, V):
    """speculators.train.vocab_mapping.build_vocab_mappings_from_distribution, restated."""
    order = sorted(counts, key=lambda t: (-counts[t], t))
    sel = order[: min(N, len(order))]
    if len(sel) < N:
        have = set(sel)
        for t in range(N):
            if t not in have:
                sel.append(t)
            if len(sel) >= N:
                break
    sel.sort()
    d2t = np.array(sel, dtype=np.int64) - np.arange(N, dtype=np.int64)
    t2d = np.zeros(V, dtype=bool)
    t2d[sel] = True
    return d2t, t2d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset")
    ap.add_argument("export")
    ap.add_argument("--max-len", type=int, default=0)
    ap.add_argument("--draft-vocab", type=int, default=0)
    a = ap.parse_args()
    src = eg.EagleGenDataset(a.dataset, as_torch=False)
    man = json.load(open(os.path.join(a.dataset, "manifest.json")))
    V, L, H = man["tokenizer"]["vocab_size"], man["num_layers"], man["hidden_size"]
    aux = man["aux_layers"]["ids"]
    na = len(aux)
    N = a.draft_vocab or min(V, 32000)
    ex = a.export

    # the source rows speculators keeps: cut to max_len, at least one supervised token
    want = []
    for i in range(len(src)):
        r = src.read_raw(i)
        T = min(len(r["input_ids"]), a.max_len) if a.max_len else len(r["input_ids"])
        if r["loss_mask"][:T].sum():
            want.append((i, T, r))
    shards = sorted(f for f in os.listdir(ex) if f.startswith("data-"))
    n_sh = len(shards)
    if shards != [f"data-{k:05d}-of-{n_sh:05d}.arrow" for k in range(n_sh)] or not n_sh:
        fail(f"arrow shards {shards}")
    top = sorted(os.listdir(ex))
    expect_top = sorted(shards + ["dataset_info.json", "state.json", "hidden_states", f"d2t-{N}.npy", f"t2d-{N}.npy",
                                  "eaglegen_export.json"])
    if top != expect_top:
        fail(f"files {top}, want {expect_top}")

    feats = {"input_ids": {"feature": {"dtype": "int64", "_type": "Value"}, "_type": "List"},
             "loss_mask": {"feature": {"dtype": "int64", "_type": "Value"}, "_type": "List"},
             "seq_len": {"dtype": "int64", "_type": "Value"}}
    cols = {"input_ids": [], "loss_mask": [], "seq_len": []}
    for sh in shards:
        schema, meta, rows = read_arrow_stream(os.path.join(ex, sh))
        if not rows["seq_len"]:
            fail(f"{sh} holds no row")
        if schema != [("input_ids", "list<int64>"), ("loss_mask", "list<int64>"), ("seq_len", "int64")]:
            fail(f"schema {schema}")
        if json.loads(meta.get("huggingface", "null")) != {"info": {"features": feats}}:
            fail(f"schema metadata {meta}")
        for k in cols:
            cols[k].extend(rows[k])
    info = json.load(open(os.path.join(ex, "dataset_info.json")))
    if info.get("features") != feats:
        fail(f"dataset_info.json features {info.get('features')}")
    st = json.load(open(os.path.join(ex, "state.json")))
    if (st["_data_files"] != [{"filename": s} for s in shards] or st["_format_type"] != "torch" or
            st["_format_columns"] is not None or st["_split"] is not None or len(st["_fingerprint"]) != 16):
        fail(f"state.json {st}")
    if len(cols["seq_len"]) != len(want):
        fail(f"{len(cols['seq_len'])} rows, want {len(want)} (samples with a supervised token)")

    hs_dir = os.path.join(ex, "hidden_states")
    if sorted(os.listdir(hs_dir)) != sorted(f"hs_{j}.safetensors" for j in range(len(want))):
        fail(f"hidden_states/ holds {sorted(os.listdir(hs_dir))[:5]}…, want hs_0..hs_{len(want) - 1}")
    counts = {}
    pre_differs = 0
    for j, (i, T, r) in enumerate(want):
        ids = r["input_ids"][:T].astype(np.int64)
        mask = r["loss_mask"][:T].astype(np.int64)
        if not np.array_equal(cols["input_ids"][j], ids) or not np.array_equal(cols["loss_mask"][j], mask):
            fail(f"row {j} (sample {i}): input_ids/loss_mask differ from eaglegen's reader")
        if cols["seq_len"][j] != T:
            fail(f"row {j}: seq_len {cols['seq_len'][j]}, want {T}")
        t = read_safetensors(os.path.join(hs_dir, f"hs_{j}.safetensors"))
        if sorted(t) != ["hidden_states", "token_ids"]:
            fail(f"hs_{j}: keys {sorted(t)}")
        if t["token_ids"][:2] != ("I64", [T]) or t["hidden_states"][:2] != ("BF16", [T, na + 1, H]):
            fail(f"hs_{j}: token_ids {t['token_ids'][:2]}, hidden_states {t['hidden_states'][:2]}")
        if not np.array_equal(t["token_ids"][2], ids):
            fail(f"hs_{j}: token_ids differ from input_ids")
        hs = t["hidden_states"][2]
        if not np.array_equal(hs[:, :na], r["aux_hidden"][:T]):
            fail(f"hs_{j}: aux planes differ from eaglegen's aux_hidden")
        pre = r["final_pre_hidden"] if r["final_pre_hidden"] is not None else r["final_hidden"]
        if src.final_source == "post_norm":
            fail("source is post-norm only; the exporter should have refused it")
        if not np.array_equal(hs[:, na], pre[:T]):
            fail(f"hs_{j}: last plane is not the pre-norm final state")
        if r["final_pre_hidden"] is not None and not np.array_equal(r["final_hidden"][:T], pre[:T]):
            pre_differs += 1
        for tok in ids[mask.astype(bool)]:
            counts[int(tok)] = counts.get(int(tok), 0) + 1
    if src.final_source == "both" and pre_differs != len(want):
        fail(f"post-norm equals pre-norm in {len(want) - pre_differs} rows: the test cannot tell them apart")

    d2t = np.load(os.path.join(ex, f"d2t-{N}.npy"))
    t2d = np.load(os.path.join(ex, f"t2d-{N}.npy"))
    if d2t.dtype != np.int64 or d2t.shape != (N,) or t2d.dtype != np.bool_ or t2d.shape != (V,):
        fail(f"d2t {d2t.dtype}{d2t.shape}, t2d {t2d.dtype}{t2d.shape}")
    wd, wt = speculators_vocab(counts, N, V)
    if not np.array_equal(d2t, wd) or not np.array_equal(t2d, wt):
        fail("d2t/t2d differ from speculators' rule over the exported rows")
    if not np.array_equal(np.flatnonzero(t2d), np.arange(N) + d2t):
        fail("t2d and d2t disagree")

    prov = json.load(open(os.path.join(ex, "eaglegen_export.json")))
    ids_sp = [k + 1 for k in aux]
    if prov["aux_layers"]["target_layer_ids"] != ids_sp or prov["aux_layers"]["final_id"] != L:
        fail(f"ids {prov['aux_layers']}")
    if man["aux_layers"]["trainer_ids"]["vllm_speculators"]["aux_ids"] != ids_sp:
        fail("manifest's vllm_speculators ids differ from k + 1")
    if f"--target-layer-ids {' '.join(map(str, ids_sp))} " not in prov["command"] + " ":
        fail(f"command {prov['command']}")
    if f"--draft-vocab-size {N}" not in prov["command"]:
        fail(f"command {prov['command']}")
    if prov["rows"] != len(want) or prov["left_out_unsupervised"] != len(src) - len(want):
        fail(f"counts {prov}")
    print(f"speculators export ok: {len(want)} rows in {n_sh} shard(s), {sum(w[1] for w in want)} tokens, "
          f"hidden_states [T, {na + 1}, {H}], target_layer_ids {ids_sp} (eaglegen {aux}), d2t {N}, "
          f"{len(counts)} distinct supervised ids")


if __name__ == "__main__":
    main()
