"""`make trainer-check`, speculators part: run inside a venv holding speculators 0.9.x
(tests/trainer_check_speculators.sh builds it). Loads an `eaglegen export --to speculators`
folder with speculators' own code and compares with eaglegen's reader:

1. `datasets.load_from_disk` + speculators' ArrowDataset (file transfer, on_missing=raise):
   every row's hidden_states == the aux planes, verifier_last_hidden_states == the pre-norm
   final state, input_ids / loss_mask == eaglegen's, bit for bit;
2. the printed command line, parsed by speculators' TrainConfig.resolve, builds the EAGLE-3
   drafter (build_draft_model: verifier config, target_layer_ids, d2t/t2d from --data-path);
   its verifier_norm applied to the last plane reproduces eaglegen's post-norm state (what
   lm_head sees) within BF16 rounding, while applied to the post-norm state it does not;
3. create_train_val_loaders (ArrowDataset + CollateFn + shift_batch) gives a packed batch
   equal to the shifted rows;
4. one training step on CPU, as speculators' Trainer does it (autocast, forward with the
   trainer kwargs, backward, clip, AdamW step): finite loss, parameters move. speculators'
   own Trainer cannot run on CPU (it moves the model to device index local_rank, i.e. CUDA).

   Also: pyarrow's full validation of every record batch, and the same export split into
   several shards of small batches (SPLIT_EXPORT) loads to the same rows.

usage: trainer_check_speculators.py DATASET EXPORT VERIFIER_DIR SPLIT_EXPORT"""
import json
import shlex
import sys
import os

import numpy as np
import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "dataset", "python"))
import eaglegen_data as eg  # noqa: E402

from datasets import load_from_disk  # noqa: E402
from speculators.models.eagle3.data import shift_batch  # noqa: E402
from speculators.model import SpeculatorModel  # noqa: E402
from speculators.train import cli as spcli  # noqa: E402
from speculators.train.config import TrainConfig  # noqa: E402
from speculators.train.data import ArrowDataset, CollateFn  # noqa: E402
from speculators.train.dataloader import create_train_val_loaders  # noqa: E402
from hs_connectors import FileTransfer  # noqa: E402
from pathlib import Path  # noqa: E402


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def bits(t):
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def main():
    ds_dir, ex, verifier, split = sys.argv[1:5]
    from importlib.metadata import version
    print(f"speculators {version('speculators')}, datasets {version('datasets')}, torch {torch.__version__} (CPU)")
    src = eg.EagleGenDataset(ds_dir, as_torch=False)
    man = json.load(open(os.path.join(ds_dir, "manifest.json")))
    prov = json.load(open(os.path.join(ex, "eaglegen_export.json")))
    na, H = len(man["aux_layers"]["ids"]), man["hidden_size"]
    rows = [i for i in range(len(src)) if src.read_raw(i)["loss_mask"].sum()]

    # 1. their dataset classes
    hf = load_from_disk(ex)
    if len(hf) != len(rows) or hf.format["type"] != "torch":
        fail(f"load_from_disk: {len(hf)} rows, format {hf.format}")
    ad = ArrowDataset(max_len=8192, datapath=ex, transfer=FileTransfer(Path(ex) / "hidden_states"), on_missing="raise")
    if len(ad) != len(rows):
        fail(f"ArrowDataset has {len(ad)} rows, want {len(rows)}")
    for j, i in enumerate(rows):
        r = src.read_raw(i)
        it = ad[j]
        if not isinstance(it, dict):
            fail(f"ArrowDataset row {j}: {it!r} (token ids did not match?)")
        T = len(r["input_ids"])
        if it["hidden_states"].dtype != torch.bfloat16 or tuple(it["hidden_states"].shape) != (T, na * H):
            fail(f"row {j}: hidden_states {it['hidden_states'].dtype} {tuple(it['hidden_states'].shape)}")
        if not np.array_equal(bits(it["hidden_states"]), r["aux_hidden"].reshape(T, na * H)):
            fail(f"row {j}: hidden_states differ from eaglegen's aux_hidden")
        pre = r["final_pre_hidden"] if r["final_pre_hidden"] is not None else r["final_hidden"]
        if not np.array_equal(bits(it["verifier_last_hidden_states"]), pre):
            fail(f"row {j}: verifier_last_hidden_states is not eaglegen's pre-norm final state")
        if not np.array_equal(it["input_ids"].numpy(), r["input_ids"].astype(np.int64)):
            fail(f"row {j}: input_ids differ")
        if not np.array_equal(it["loss_mask"].numpy(), r["loss_mask"].astype(np.int64)):
            fail(f"row {j}: loss_mask differs")
    import glob
    import pyarrow as pa
    nb = 0
    for f in sorted(glob.glob(os.path.join(ex, "*.arrow")) + glob.glob(os.path.join(split, "*.arrow"))):
        with pa.memory_map(f) as mm:
            for b in pa.ipc.open_stream(mm):
                b.validate(full=True)
                nb += 1
    hs2 = load_from_disk(split)
    if len(hs2.cache_files) < 2 or hs2.with_format(None)[:] != hf.with_format(None)[:]:
        fail(f"the split export ({len(hs2.cache_files)} shards) does not load to the same rows")
    print(f"   pyarrow {pa.__version__}: {nb} record batches pass validate(full=True); the export split into "
          f"{len(hs2.cache_files)} shards loads to the same rows")
    print(f"1. load_from_disk + ArrowDataset: {len(ad)} rows equal to eaglegen's reader (aux planes, pre-norm last plane, ids, mask)")

    # 2. the printed command, parsed by speculators, builds the drafter
    argv = shlex.split(prov["command"])
    if argv[:2] != ["speculators", "train"]:
        fail(f"command {argv[:2]}")
    argv = argv[2:]
    argv[argv.index("--verifier-name-or-path") + 1] = verifier
    argv += ["--save-path", os.path.join(os.path.dirname(os.path.abspath(ex)), "ckpt"), "--num-workers", "0",
             "--draft-attn-impl", "sdpa", "--loss-implementation", "eager", "--train-data-ratio", "0.75",
             "--mask-token-id", str(json.load(open(os.path.join(verifier, "config.json")))["pad_token_id"])]
    print("   command: speculators train " + " ".join(argv))
    cfg = TrainConfig.resolve(argv)
    args = __import__("argparse").Namespace(**cfg.flatten())
    d2t, t2d, nvocab = spcli.parse_vocab_mappings(args)
    if d2t is None or nvocab != prov["draft_vocab"]["size"]:
        fail(f"speculators did not pick up d2t/t2d from --data-path ({nvocab})")
    model_class = SpeculatorModel.registry[args.speculator_type]
    model = spcli.build_draft_model(args, model_class, t2d, d2t, nvocab)
    if list(model.target_layer_ids) != prov["aux_layers"]["target_layer_ids"]:
        fail(f"drafter target_layer_ids {model.target_layer_ids}")
    worst, worst_twice = 0.0, 0.0
    with torch.no_grad():
        for j, i in enumerate(rows):
            r = src.read_raw(i)
            pre = torch.from_numpy(eg.bf16_to_float32(r["final_pre_hidden"]))
            post = eg.bf16_to_float32(r["final_hidden"]).astype(np.float64)
            got = model.verifier_norm(pre).double().numpy()
            twice = model.verifier_norm(torch.from_numpy(post).float()).double().numpy()
            worst = max(worst, float((np.abs(got - post) / np.abs(post).clip(1e-30)).max()))
            worst_twice = max(worst_twice, float((np.abs(twice - post) / np.abs(post).clip(1e-30)).max()))
    bound = 2 * 2.0 ** -8 * 1.01
    print(f"2. drafter built from the printed command: target_layer_ids {model.target_layer_ids}, draft vocab {nvocab}; "
          f"verifier_norm(last plane) vs eaglegen post-norm: worst rel {worst:.3g} (bound {bound:.3g}); "
          f"norm applied to post-norm data: {worst_twice:.3g}")
    if worst > bound:
        fail("speculators' verifier norm of the exported state does not give eaglegen's post-norm state")
    if worst_twice <= 4 * bound:
        fail("the test cannot tell a second norm apart")

    # 3. their loaders and collator
    train_loader, _val = create_train_val_loaders(
        data_path=ex, total_seq_len=args.total_seq_len, hidden_states_dtype=torch.bfloat16,
        transfer=FileTransfer(Path(ex) / "hidden_states"), vllm_endpoint=args.vllm_endpoint, on_missing="raise",
        verifier_name_or_path=verifier, request_timeout=None, max_retries=0, generation_validation_retries=0,
        max_consecutive_generation_failures=1, hidden_size=H, num_target_layers=na, num_workers=0, prefetch_factor=None,
        preprocess=shift_batch, train_data_ratio=0.75, seed=0)
    batch = next(iter(train_loader))
    L = args.total_seq_len
    if tuple(batch["hidden_states"].shape) != (1, L, na * H) or tuple(batch["input_ids"].shape) != (1, L):
        fail(f"collated shapes {tuple(batch['hidden_states'].shape)} {tuple(batch['input_ids'].shape)}")
    # the packed batch holds shifted rows back to back; compare each document with its row
    doc = batch["document_ids"][0]
    n_docs = int(doc.max()) + 1
    ids_by_row = {j: src.read_raw(i) for j, i in enumerate(rows)}
    matched = 0
    for d in range(n_docs):
        pos = (doc == d).nonzero().flatten()
        ids = batch["input_ids"][0, pos].numpy()
        hs = bits(batch["hidden_states"][0, pos])
        vl = bits(batch["verifier_last_hidden_states"][0, pos])
        for j, r in ids_by_row.items():
            T = len(r["input_ids"])
            if len(pos) == T - 1 and np.array_equal(ids, r["input_ids"][1:]):
                pre = r["final_pre_hidden"] if r["final_pre_hidden"] is not None else r["final_hidden"]
                if not np.array_equal(hs, r["aux_hidden"].reshape(T, na * H)[:-1]) or not np.array_equal(vl, pre[1:]):
                    fail(f"collated document {d} (row {j}): hidden states are not the shifted row")
                if not np.array_equal(batch["loss_mask"][0, pos].numpy(), r["loss_mask"][1:].astype(np.int64)):
                    fail(f"collated document {d} (row {j}): loss mask is not the shifted row")
                matched += 1
                break
    if matched != n_docs or not n_docs:
        fail(f"{matched} of {n_docs} collated documents match a row")
    print(f"3. create_train_val_loaders + CollateFn + shift_batch: one packed batch [1, {L}], {n_docs} documents, each the shifted row")

    # 4. one CPU training step, the way speculators' Trainer makes it
    train_kwargs, _ = model_class.get_trainer_kwargs(**vars(args))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    cpu_batch = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _draft, loss, metrics = model(**cpu_batch, **train_kwargs)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    moved = sum(not torch.equal(before[n], p.detach()) for n, p in model.named_parameters() if n in before)
    if not torch.isfinite(loss) or moved == 0:
        fail(f"training step: loss {loss}, {moved} parameters moved")
    print(f"4. one CPU training step of speculators' Eagle3 drafter: loss {float(loss.detach()):.4f}, {moved}/{len(before)} "
          f"parameter tensors updated (speculators' Trainer itself needs CUDA: model.to(local_rank))")
    print("trainer-check speculators: ok")


if __name__ == "__main__":
    main()
