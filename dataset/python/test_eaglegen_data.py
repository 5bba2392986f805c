"""The Python loader reads what the C writer wrote, bit for bit (run by tests/run_all.sh
from the repository root with $BUILD set; needs numpy + zstandard only)."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zlib

import numpy as np
import zstandard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eaglegen_data as eg  # noqa: E402

BUILD = os.environ.get("BUILD", "build")
WRITER = os.path.join(BUILD, "tests", "test_dataset_writer")
failures = 0


def check(cond, msg):
    global failures
    if not cond:
        failures += 1
        print(f"    CHECK failed: {msg}")


def expect(d, sid, name, dtype):
    return np.fromfile(os.path.join(d, "expect", f"{sid}.{name}.bin"), dtype=dtype)


def test_bit_identical(d):
    ds = eg.EagleGenDataset(d, as_torch=False)
    check(len(ds) == 11, f"len {len(ds)}")
    check(ds.n_aux == 3 and ds.hidden_size == 48, "shape")
    m = ds.manifest
    check(m["aux_layers"]["ids"] == [1, 29, 57] and m["aux_layers"]["hf_hidden_states_index"] == [2, 30, 58], "aux ids")
    check(m["final_hidden"]["source"] == "post_norm", "final source")
    check(m["totals"]["samples"] == 11, "totals")
    hist = {}
    for i in range(len(ds)):
        sid = f"py{i:06d}"
        meta = json.load(open(os.path.join(d, "expect", f"{sid}.json")))
        T, na, H = meta["T"], meta["n_aux"], meta["H"]
        raw = ds.read_raw(i)
        check(raw["meta"]["id"] == sid and raw["meta"]["seed"] == meta["seed"], f"{sid} meta")
        check(raw["meta"]["source_line"] == meta["source_line"] and raw["meta"]["finish"] == meta["finish"], f"{sid} meta2")
        ids = expect(d, sid, "ids", "<i4")
        mask = expect(d, sid, "mask", np.uint8)
        aux = expect(d, sid, "aux", "<u2").reshape(T, na, H)
        fin = expect(d, sid, "final", "<u2").reshape(T, H)
        check(np.array_equal(raw["input_ids"], ids), f"{sid} ids")
        check(np.array_equal(raw["loss_mask"], mask), f"{sid} mask")
        check(np.array_equal(raw["aux_hidden"], aux), f"{sid} aux bits")
        check(np.array_equal(raw["final_hidden"], fin), f"{sid} final bits")
        item = ds[i]
        check(item["hidden_states"].shape == (T, na * H) and item["hidden_states"].dtype == np.float32, f"{sid} hs shape")
        check(item["target_hidden_states"].shape == (T, H), f"{sid} target shape")
        # float32 widening is exact: back to the same bits, layer-concatenated per token
        back = (item["hidden_states"].view(np.uint32) >> 16).astype(np.uint16)
        check(np.array_equal(back, aux.reshape(T, na * H)), f"{sid} widened aux")
        check(np.array_equal(eg.float32_to_bf16(item["target_hidden_states"]), fin), f"{sid} widened final")
        check(item["input_ids"].dtype == np.int64 and np.array_equal(item["input_ids"], ids), f"{sid} item ids")
        for t in np.flatnonzero(mask):
            hist[int(ids[t])] = hist.get(int(ids[t]), 0) + 1
    h = m["loss_token_histogram"]
    check(dict(zip(h["ids"], h["counts"])) == hist, "manifest histogram")
    # random access by id
    for k in (7, 0, 10, 3):
        sid = f"py{k:06d}"
        check(ds.index_of(sid) == k and ds.by_id(sid)["id"] == sid, f"by id {sid}")
    # a single shard, and its tar members as standard tools see them
    shard = os.path.join(d, "shard-000001.tar")
    one = eg.EagleGenDataset(shard, as_torch=False)
    check(len(one) == 4 and one.read_raw(0)["meta"]["id"] == "py000004", "single shard")
    with tarfile.open(shard) as tf:
        mem = tf.getmembers()
        names = [x.name for x in mem]
        check(names == ["00000000.egs", "00000001.egs", "00000002.egs", "00000003.egs", "index.egi", "trailer.egt"], f"members {names}")
        ix = one.shards[0]
        for j in range(4):
            check(mem[j].offset_data == ix.offsets[j] and mem[j].size == ix.sizes[j], f"member {j} offset")
        rec = tf.extractfile(mem[2]).read()
        r = eg.decode_record(rec)
        check(r["meta"]["id"] == "py000006", "record extracted with tarfile decodes")


def test_damage(d):
    shard = os.path.join(d, "shard-000000.tar")
    orig = open(shard, "rb").read()
    ds = eg.EagleGenDataset(d, as_torch=False)
    ix = ds.shards[0]
    b = bytearray(orig)
    b[ix.offsets[2] + ix.sizes[2] - 100] ^= 0x55
    open(shard, "wb").write(bytes(b))
    try:
        ds.read_raw(2)
        check(False, "flipped byte not detected")
    except eg.EagleGenDataError as e:
        check("shard-000000.tar" in str(e) and "py000002" in str(e), f"error names shard and sample: {e}")
    check(ds.read_raw(1)["meta"]["id"] == "py000001", "other samples still read")
    b = bytearray(orig)
    b[ix.offsets[1]] = ord("X")
    open(shard, "wb").write(bytes(b))
    try:
        ds.read_raw(1)
        check(False, "bad magic not detected")
    except eg.EagleGenDataError as e:
        check("bad magic" in str(e) and "py000001" in str(e), f"magic error: {e}")
    open(shard, "wb").write(orig[:-3000])
    try:
        eg.EagleGenDataset(d, as_torch=False)
        check(False, "truncation not detected")
    except eg.EagleGenDataError as e:
        check("shard-000000.tar" in str(e), f"truncation error: {e}")
    open(shard, "wb").write(orig)


def test_frame_exact(d):
    """A section is exactly one zstd frame (FORMAT.md §0), as the C reader demands: bytes
    after it (a second frame, trailing junk) or a frame cut short are refused, not read."""
    import zstandard
    raw = bytes(range(256)) * 8
    f = zstandard.ZstdCompressor(write_checksum=True, write_content_size=True).compress(raw)
    check(eg._frame(f, len(raw), "x") == raw, "a whole frame reads")
    for name, buf in (("4 bytes after it", f + b"junk"), ("a second frame", f + f), ("cut short", f[:-2])):
        expect_error(lambda: eg._frame(buf, len(raw), "meta"), eg.EagleGenDataError, ["meta"], f"frame {name}")


def test_json_strict(d):
    """Metadata and manifest JSON as strict as the C reader's (jansson, duplicates refused):
    what Python's json would take and C refuses is refused here too."""
    check(eg._json_loads('{"a": -9223372036854775808, "b": 9223372036854775807, "s": "\\u00e9"}')["s"] == "\u00e9",
          "int64 limits and a plain escape read")
    for name, text in (("a repeated key", '{"top_k": 1, "top_k": 2}'), ("an integer over int64", '{"a": 9223372036854775808}'),
                       ("a lone surrogate", '{"id": "\\ud800"}'), ("NaN", '{"a": NaN}')):
        try:
            eg._json_loads(text)
            check(False, f"JSON with {name} accepted")
        except ValueError:
            pass


def _pad(x):
    return x + b"\0" * (-len(x) % 512)


def rewrite_index(src, dst, n_aux=None, id0=None, finish0=False, finish0_byte=None, flags=None, trailer_flags=None,
                  swap01=False, entry0_reserved=None, trailer_reserved=None, record0_reserved=None):
    """Copy shard src to dst with its index changed (n_aux, the first entry's id bytes, with
    finish0 its finish reason flipped or finish0_byte its finish byte set, the index's flags,
    the trailer's, with swap01 the first two entries' offsets swapped: out of order; a
    reserved byte of the first entry, of the trailer, or of the first record's header,
    its CRC fixed), recompressed, and the trailer's sizes and CRC fixed: a well-formed
    shard carrying a bad value. Also used by tests/t_dataset_corrupt.sh."""
    b = open(src, "rb").read()
    size = len(b)
    t = bytearray(b[size - 1536 : size - 1536 + 64])
    _, _, ioff, isize, iraw, _, _ = struct.unpack_from("<IIQQQQQ", t, 8)
    ib = bytearray(zstandard.ZstdDecompressor().decompress(b[ioff : ioff + isize], max_output_size=iraw))
    if entry0_reserved is not None:
        ib[32 + 29] = entry0_reserved
    if trailer_reserved is not None:
        t[56] = trailer_reserved
    if record0_reserved is not None:
        r0 = struct.unpack_from("<Q", ib, 32)[0]
        h = bytearray(b[r0 : r0 + 128])
        h[112] = record0_reserved
        struct.pack_into("<I", h, 124, zlib.crc32(bytes(h[:124])))
        b = b[:r0] + bytes(h) + b[r0 + 128 :]
    if n_aux is not None:
        struct.pack_into("<I", ib, 8, n_aux)
    if finish0:
        ib[32 + 28] ^= 1
    if finish0_byte is not None:
        ib[32 + 28] = finish0_byte
    if flags is not None:
        struct.pack_into("<I", ib, 12, flags)
    if trailer_flags is not None:
        struct.pack_into("<I", t, 12, trailer_flags)
    if swap01:
        e1 = 32 + 32 + struct.unpack_from("<I", ib, 32 + 24)[0]
        o0, o1 = struct.unpack_from("<Q", ib, 32)[0], struct.unpack_from("<Q", ib, e1)[0]
        struct.pack_into("<Q", ib, 32, o1)
        struct.pack_into("<Q", ib, e1, o0)
    if id0 is not None:
        il = struct.unpack_from("<I", ib, 32 + 24)[0]
        struct.pack_into("<I", ib, 32 + 24, len(id0))
        ib = ib[:64] + id0 + ib[64 + il :]
    z = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=True).compress(bytes(ib))
    ti = tarfile.TarInfo("index.egi")
    ti.size = len(z)
    struct.pack_into("<QQ", t, 24, len(z), len(ib))
    struct.pack_into("<I", t, 60, zlib.crc32(bytes(t[:60])))
    out = b[: ioff - 512] + ti.tobuf(format=tarfile.USTAR_FORMAT) + _pad(z) + b[size - 2048 : size - 1536]
    open(dst, "wb").write(out + _pad(bytes(t)) + b"\0" * 1024)


def with_meta(rec, meta):
    """Record bytes rec with its metadata frame replaced by JSON text meta (header fixed)."""
    rec = bytearray(rec)
    old = struct.unpack_from("<Q", rec, 32)[0]
    m = meta.encode()
    z = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=True).compress(m)
    out = bytearray(rec[:128]) + z + rec[128 + old :]
    struct.pack_into("<QQ", out, 32, len(z), len(m))
    struct.pack_into("<I", out, 124, zlib.crc32(bytes(out[:124])))
    return bytes(out)


def expect_error(fn, exc, needles, what):
    try:
        fn()
        check(False, f"{what}: accepted")
    except exc as e:
        check(all(n in str(e) for n in needles), f"{what}: message {e!r} lacks {needles}")
    except Exception as e:  # noqa: BLE001 - a bare error is what this test guards against
        check(False, f"{what}: raised {type(e).__name__}: {e}")


def test_bad_fields(d):
    tmp = os.path.join(d, "bad")
    os.makedirs(tmp, exist_ok=True)
    shard = os.path.join(d, "shard-000000.tar")
    for name, kw, needle in (("badutf8", {"id0": b"py\xff\xfe"}, "UTF-8"), ("nul", {"id0": b"py\0x"}, "NUL"),
                             ("naux", {"n_aux": 1 << 30}, "n_aux")):
        bad = os.path.join(tmp, name + ".tar")
        rewrite_index(shard, bad, **kw)
        expect_error(lambda: eg.EagleGenDataset(bad, as_torch=False), eg.EagleGenDataError, [bad, needle], name)
    good = os.path.join(tmp, "good.tar")
    rewrite_index(shard, good, id0=b"py000000")
    check(len(eg.EagleGenDataset(good, as_torch=False)) > 0, "rewritten shard with the same id still reads")

    man = json.load(open(os.path.join(d, "manifest.json")))
    for name, edit in (("no_bytes", lambda m: m["shards"][0].pop("bytes")),
                       ("str_samples", lambda m: m["shards"][0].__setitem__("samples", "3")),
                       ("shards_str", lambda m: m.__setitem__("shards", "x")),
                       ("no_shards", lambda m: m.pop("shards")),
                       ("file_int", lambda m: m["shards"][0].__setitem__("file", 5)),
                       ("naux_str", lambda m: m.__setitem__("n_aux", "3")),
                       ("naux_other", lambda m: m.__setitem__("n_aux", 2)),
                       # what the C reader requires too (dataset/manifest.c)
                       ("fv_bool", lambda m: m.__setitem__("format_version", True)),
                       ("no_final", lambda m: m.pop("final_hidden")),
                       ("final_str", lambda m: m.__setitem__("final_hidden", "post_norm")),
                       ("no_model", lambda m: m.pop("model")),
                       ("aux_str", lambda m: m["aux_layers"].__setitem__("ids", ["1", "29", "57"])),
                       ("weights_short", lambda m: m["model"].__setitem__("weights_sha256", "ab")),
                       ("sha_short", lambda m: m["shards"][0].__setitem__("sha256", "ab12")),
                       ("no_raw_bytes", lambda m: m["shards"][0].pop("raw_bytes")),
                       ("stop_str", lambda m: m["shards"][0].__setitem__("finish_stop", "1")),
                       ("worker_noindex", lambda m: m.__setitem__("worker", {"count": 1})),
                       ("hist_desc", lambda m: m["loss_token_histogram"].__setitem__(
                           "ids", m["loss_token_histogram"]["ids"][::-1])),
                       ("hist_zero", lambda m: m["loss_token_histogram"]["counts"].__setitem__(0, 0)),
                       ("hist_str", lambda m: m["loss_token_histogram"].__setitem__("ids", ["3"])),
                       # the shards' shape against the manifest's
                       ("aux_fewer", lambda m: m["aux_layers"].__setitem__("ids", [1, 29])),
                       ("hidden_other", lambda m: m.__setitem__("hidden_size", 128))):
        dd = os.path.join(tmp, "ds_" + name)
        shutil.copytree(d, dd, ignore=shutil.ignore_patterns("bad", "sf", "expect"))
        m = json.loads(json.dumps(man))
        edit(m)
        mp = os.path.join(dd, "manifest.json")
        json.dump(m, open(mp, "w"))
        expect_error(lambda: eg.EagleGenDataset(dd, as_torch=False), eg.EagleGenDataError, [mp], name)
        # the C reader refuses each too: the two readers agree on the same bytes
        eg_bin = os.path.join(BUILD, "eaglegen")
        if os.access(eg_bin, os.X_OK):
            r = subprocess.run([eg_bin, "inspect", dd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            check(r.returncode != 0, f"{name}: the C reader accepts what the loader refuses")

    # NaN is not JSON: Python's json takes it, the C reader does not
    dd = os.path.join(tmp, "ds_nan")
    shutil.copytree(d, dd, ignore=shutil.ignore_patterns("bad", "sf", "expect"))
    mp = os.path.join(dd, "manifest.json")
    open(mp, "w").write(json.dumps(man).replace('"hidden_size": 48', '"hidden_size": 48, "x": NaN', 1))
    expect_error(lambda: eg.EagleGenDataset(dd, as_torch=False), eg.EagleGenDataError, [mp, "NaN"], "manifest NaN")
    # unmerged workers: one dataset, described alike; a stray file beside them is not a manifest
    dw = os.path.join(tmp, "ds_workers")
    shutil.copytree(d, dw, ignore=shutil.ignore_patterns("bad", "sf", "expect"))
    os.rename(os.path.join(dw, "manifest.json"), os.path.join(dw, "manifest.w0of2.json"))
    w1 = json.loads(json.dumps(man))
    w1["shards"] = []
    json.dump(w1, open(os.path.join(dw, "manifest.w1of2.json"), "w"))
    open(os.path.join(dw, "manifest.w0of2.old.json"), "w").write("not a manifest")
    check(len(eg.EagleGenDataset(dw, as_torch=False)) == len(eg.EagleGenDataset(d, as_torch=False)),
          "two workers' manifests (one empty) read as one dataset, the stray file ignored")
    for what, edit in (("aux layer ids", lambda m: m["aux_layers"].__setitem__("ids", [2, 30, 58])),
                       ("hidden size", lambda m: m.__setitem__("hidden_size", 96)),
                       ("final hidden source", lambda m: m["final_hidden"].__setitem__("source", "pre_norm"))):
        w = json.loads(json.dumps(w1))
        edit(w)
        json.dump(w, open(os.path.join(dw, "manifest.w1of2.json"), "w"))
        expect_error(lambda: eg.EagleGenDataset(dw, as_torch=False), eg.EagleGenDataError,
                     ["manifest.w1of2.json", what, "not one dataset"], f"workers differ in {what}")
    # the model by content: another name (a moved checkpoint) is one dataset, other weights
    # of the same config are not, a worker that did not record them matches; both readers
    eg_bin = os.path.join(BUILD, "eaglegen")
    w0 = json.load(open(os.path.join(dw, "manifest.w0of2.json")))
    for name, h0, h1, ok in (("other name", None, None, True), ("weights recorded by one", "a" * 64, None, True),
                             ("same weights", "a" * 64, "a" * 64, True), ("other weights", "a" * 64, "b" * 64, False)):
        w = json.loads(json.dumps(w1))
        w["model"]["name"] = "moved-" + w["model"]["name"]
        x = json.loads(json.dumps(w0))
        for m, h in ((x, h0), (w, h1)):
            if h:
                m["model"]["weights_sha256"] = h
        json.dump(x, open(os.path.join(dw, "manifest.w0of2.json"), "w"))
        json.dump(w, open(os.path.join(dw, "manifest.w1of2.json"), "w"))
        if ok:
            check(len(eg.EagleGenDataset(dw, as_torch=False)) > 0, f"workers, {name}: one dataset")
        else:
            expect_error(lambda: eg.EagleGenDataset(dw, as_torch=False), eg.EagleGenDataError,
                         ["manifest.w1of2.json", "model weights", "not one dataset"], f"workers, {name}")
        if os.access(eg_bin, os.X_OK):
            r = subprocess.run([eg_bin, "inspect", dw], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            check((r.returncode == 0) == ok and (ok or "model weights" in r.stderr),
                  f"workers, {name}: the C reader says {r.returncode} {r.stderr.strip()}")
    json.dump(w0, open(os.path.join(dw, "manifest.w0of2.json"), "w"))
    # a finish reason that the record and the index disagree on
    fl = os.path.join(tmp, "finish.tar")
    rewrite_index(shard, fl, finish0=True)
    expect_error(lambda: eg.EagleGenDataset(fl, as_torch=False).read_raw(0), eg.EagleGenDataError,
                 [fl, "sample 0", "disagrees with the index"], "finish flipped in the index")

    ds = eg.EagleGenDataset(d, as_torch=False)
    ix = ds.shards[0]
    with open(shard, "rb") as f:
        f.seek(ix.offsets[0])
        rec = f.read(ix.sizes[0])
    base = {"finish": "stop", "gen_len": 1, "id": "x", "prompt_len": 1, "seed": "7", "source_file": "f",
            "source_line": 1, "temperature": 0.5, "top_k": 0, "top_p": 1.0}
    check(eg.decode_record(with_meta(rec, json.dumps(base)), "W")["meta"]["seed"] == 7, "good metadata reads")
    for name, edit, needle in (("no_seed", lambda m: m.pop("seed"), "seed"),
                               ("seed_abc", lambda m: m.__setitem__("seed", "abc"), "seed"),
                               ("seed_int", lambda m: m.__setitem__("seed", 7), "seed"),
                               ("seed_neg", lambda m: m.__setitem__("seed", "-1"), "seed"),
                               ("no_id", lambda m: m.pop("id"), "id"),
                               ("finish", lambda m: m.__setitem__("finish", "eos"), "finish"),
                               ("array", lambda m: m.clear(), "metadata")):
        m = dict(base)
        edit(m)
        txt = json.dumps(m) if name != "array" else "[1]"
        expect_error(lambda: eg.decode_record(with_meta(rec, txt), "shard S, sample 0"), eg.EagleGenDataError,
                     ["shard S, sample 0", needle], name)
    nan = dict(base, temperature=float("nan"))
    expect_error(lambda: eg.decode_record(with_meta(rec, json.dumps(nan)), "shard S, sample 0"), eg.EagleGenDataError,
                 ["shard S, sample 0", "NaN"], "metadata NaN")
    for v in (0, -1, "3", 1.5):
        expect_error(lambda: eg.EagleGenDataset(d, as_torch=False, max_len=v), ValueError, ["max_len"], f"max_len={v!r}")
    check(len(eg.EagleGenDataset(d, as_torch=False, max_len=1)[0]["input_ids"]) == 1, "max_len=1")


def test_reserved_ranges(d):
    """Reserved bytes not zero and metadata numbers out of range, each refused as the C
    reader refuses them (tests/test_dataset_codec.c reserved_and_ranges holds the same
    table; tests/t_dataset_corrupt.sh gives both readers the same shards)."""
    tmp = os.path.join(d, "reserved")
    os.makedirs(tmp, exist_ok=True)
    shard = os.path.join(d, "shard-000000.tar")
    for kw, needle in (({"entry0_reserved": 1}, "entry 0 malformed"), ({"trailer_reserved": 1}, "trailer: reserved")):
        bad = os.path.join(tmp, "x.tar")
        rewrite_index(shard, bad, **kw)
        expect_error(lambda: eg.EagleGenDataset(bad, as_torch=False), eg.EagleGenDataError, [bad, needle], str(kw))
    rewrite_index(shard, os.path.join(tmp, "r.tar"), record0_reserved=0x40)
    ds = eg.EagleGenDataset(os.path.join(tmp, "r.tar"), as_torch=False)
    expect_error(lambda: ds.read_raw(0), eg.EagleGenDataError, ["sample 0", "reserved header bytes"], "record reserved")
    check(ds.read_raw(1) is not None, "the record after it reads")

    ix = eg.EagleGenDataset(d, as_torch=False).shards[0]
    with open(shard, "rb") as f:
        f.seek(ix.offsets[0])
        rec = f.read(ix.sizes[0])
    T = ix.tokens[0]
    base = {"finish": "stop", "gen_len": 1, "id": "x", "prompt_len": 1, "seed": "7", "source_file": "f",
            "source_line": 1, "temperature": 0.5, "top_k": 0, "top_p": 1.0}
    for key, val, needle in (("source_line", -1, "source_line is negative"),
                             ("prompt_len", -1, "prompt_len + gen_len"), ("gen_len", -2, "prompt_len + gen_len"),
                             ("prompt_len", T, "prompt_len + gen_len"),  # T + 1 > T
                             ("temperature", -0.5, "temperature is negative"), ("top_p", 0, "top_p is not in (0, 1]"),
                             ("top_p", 1.0000001, "top_p is not in (0, 1]"), ("top_p", -1, "top_p is not in (0, 1]"),
                             ("top_k", -1, "top_k is negative"), ("prompt_len", T - 1, None), ("temperature", 0, None),
                             ("top_p", 1, None)):
        m = dict(base, **{key: val})
        f = lambda: eg.decode_record(with_meta(rec, json.dumps(m)), "shard S, sample 0")  # noqa: E731
        if needle:
            expect_error(f, eg.EagleGenDataError, ["shard S, sample 0", "metadata: ", needle], f"{key}={val}")
        else:
            check(f()["meta"][key] == val, f"{key}={val} reads")


def test_specforge(d):
    out = os.path.join(d, "sf")
    if eg.torch is None:
        try:
            eg.export_specforge(d, out)
            check(False, "exporter ran without torch")
        except ImportError as e:
            check("torch" in str(e), "exporter says torch is missing")
        return
    import torch

    n = eg.export_specforge(d, out, group_size=4)
    check(n == 11, "exported count")
    x = torch.load(os.path.join(out, "rows_4-8", "data_5.ckpt"))
    ds = eg.EagleGenDataset(d, as_torch=True)
    it = ds[5]
    check(x["hidden_state"].shape == (1, it["input_ids"].shape[0], 48), "hidden_state shape")
    check(x["aux_hidden_state"].shape == (1, it["input_ids"].shape[0], 144), "aux shape")
    check(torch.equal(x["aux_hidden_state"][0], it["hidden_states"]), "aux equal")
    check(torch.equal(x["hidden_state"][0], it["target_hidden_states"]), "hidden_state is the post-norm state")
    check(x["input_ids"].dtype == torch.long and x["loss_mask"].dtype == torch.long, "dtypes")
    # what `eaglegen export --to specforge` refuses: an out_dir with files in it (SpecForge
    # trains on every .ckpt below it), a lone shard whose one final state no manifest
    # names, aux layers out of order; max_len carries over from a numpy dataset
    expect_error(lambda: eg.export_specforge(d, out), eg.EagleGenDataError, [out, "not empty"], "export into a full dir")
    shard = os.path.join(d, "shard-000000.tar")
    expect_error(lambda: eg.export_specforge(shard, os.path.join(d, "sf_shard")), eg.EagleGenDataError,
                 [shard, "post-norm or pre-norm"], "export of a lone one-state shard")
    dr = os.path.join(d, "bad", "ds_reversed")
    shutil.copytree(d, dr, ignore=shutil.ignore_patterns("bad", "sf", "sf*", "expect"))
    m = json.load(open(os.path.join(dr, "manifest.json")))
    m["aux_layers"]["ids"] = m["aux_layers"]["ids"][::-1]
    json.dump(m, open(os.path.join(dr, "manifest.json"), "w"))
    expect_error(lambda: eg.export_specforge(dr, os.path.join(d, "sf_rev")), eg.EagleGenDataError,
                 ["not ascending"], "export with aux layers out of order")
    short = os.path.join(d, "sf_short")
    eg.export_specforge(eg.EagleGenDataset(d, as_torch=False, max_len=3), short, stop=2)
    y = torch.load(os.path.join(short, "rows_0-5000", "data_1.ckpt"))
    check(y["input_ids"].shape == (3,) and y["hidden_state"].shape == (1, 3, 48), "max_len kept by the exporter")


def main():
    if not os.access(WRITER, os.X_OK):
        print(f"test_eaglegen_data: {WRITER} not built")
        return 1
    tmp = tempfile.mkdtemp(prefix="eg_ds_py.")
    try:
        d = os.path.join(tmp, "ds")
        subprocess.run([WRITER, "--fixture", d], check=True, stdout=subprocess.DEVNULL)
        for t in (test_bit_identical, test_damage, test_bad_fields, test_frame_exact, test_json_strict,
                  test_reserved_ranges, test_specforge):
            before = failures
            t(d)
            print(f"  {'ok  ' if failures == before else 'FAIL'} eaglegen_data.{t.__name__}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"eaglegen_data: {'0 failed' if not failures else f'{failures} checks failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
