"""SpecForge 0.2.0 reads an `eaglegen export --to specforge` directory with its own code.

usage: trainer_check_specforge.py DATASET OUT [MAX_LEN]   (run with the trainer venv's python)

1. build_offline_eagle3_dataset(OUT/hidden_states) (SpecForge's OfflineEagle3Dataset):
   every item against eaglegen's reader (dataset/python/eaglegen_data.py), through
   SpecForge's own processing (target shifted left by padding(), last loss position 0);
2. its DataCollatorWithPadding on a batch of two;
3. generate_vocab_mapping_file (SpecForge's own rule) over the samples == OUT/vocab_mapping.pt;
4. one training step on the CPU: AutoDraftModelConfig.from_file(draft_config.json),
   AutoEagle3DraftModel.from_config (sdpa), load_embedding(OUT/target),
   load_vocab_mapping, TargetHead(OUT/target).load_weights (its from_pretrained calls
   .cuda(), so the two steps are taken by hand), OnlineEagle3Model forward + backward +
   AdamW step, as train_eagle3.py's offline path runs it.
"""
import os
import sys
import tempfile

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "dataset", "python"))
import eaglegen_data as eg  # noqa: E402
try:  # the v0.2.0 tag's layout, then the later one (what PyPI's specforge 0.2.0 wheel may carry)
    from specforge.core.eagle3 import OnlineEagle3Model  # noqa: E402
except ImportError:
    from specforge.algorithms.eagle3.model import OnlineEagle3Model  # noqa: E402
from specforge.data.preprocessing import build_offline_eagle3_dataset, generate_vocab_mapping_file  # noqa: E402
from specforge.data.utils import DataCollatorWithPadding  # noqa: E402
from specforge.modeling.auto import AutoDraftModelConfig  # noqa: E402
try:  # v0.2.0 tag; later code renamed it
    from specforge.modeling.auto import AutoEagle3DraftModel as AutoDraft  # noqa: E402
except ImportError:
    from specforge.modeling.auto import AutoDraftModel as AutoDraft  # noqa: E402
from specforge.modeling.target.target_head import TargetHead  # noqa: E402

ds_path, out = sys.argv[1], sys.argv[2]
max_len = int(sys.argv[3]) if len(sys.argv) > 3 else 2048
ours = eg.EagleGenDataset(ds_path, as_torch=True)
sf = build_offline_eagle3_dataset(os.path.join(out, "hidden_states"), max_len)
assert len(sf) == len(ours), (len(sf), len(ours))
print(f"[specforge] OfflineEagle3Dataset: {len(sf)} files")
n_cmp = 0
for k, p in enumerate(sf.datapaths):
    i = int(os.path.basename(p)[len("data_"):-len(".ckpt")])
    item, ref = sf[k], ours[i]
    n = min(len(ref["input_ids"]), max_len)
    ids, mask = ref["input_ids"][:n], ref["loss_mask"][:n].long().clone()
    mask[-1] = 0
    aux, fin = ref["hidden_states"][:n], ref["target_hidden_states"][:n]
    # the v0.2.0 tag shifts input_ids and target left in the dataset (padding(left=False)); later code does not
    shifted = not torch.equal(item["input_ids"][0], ids)
    if shifted:
        assert torch.equal(item["input_ids"][0, :-1], ids[1:]) and item["input_ids"][0, -1] == 0, p
        assert torch.equal(item["target"][0, :-1], fin[1:]), p
    else:
        assert torch.equal(item["target"][0], fin), p
    assert item["target"].dtype == torch.bfloat16
    assert torch.equal(item["loss_mask"][0], mask), p
    assert item["hidden_state"].dtype == torch.bfloat16 and torch.equal(item["hidden_state"][0], aux), p
    assert torch.equal(item["attention_mask"], torch.ones(1, n, dtype=torch.long)), p
    n_cmp += 1
print(f"[specforge] every item equals eaglegen's reader ({n_cmp} samples: input_ids, loss_mask, aux hidden_state, "
      f"post-norm target; shifted by the dataset class: {shifted})")

batch = DataCollatorWithPadding()([sf[0], sf[1]])
L = max(sf[0]["input_ids"].shape[1], sf[1]["input_ids"].shape[1])
H = ours.hidden_size
assert batch["hidden_state"].shape == (2, L, 3 * H) and batch["target"].shape == (2, L, H), (
    batch["hidden_state"].shape, batch["target"].shape)
print(f"[specforge] DataCollatorWithPadding: " + ", ".join(f"{k} {tuple(v.shape)}" for k, v in batch.items()))

cfg = AutoDraftModelConfig.from_file(os.path.join(out, "draft_config.json"))
with tempfile.TemporaryDirectory() as tmp:
    items = [{"input_ids": ours[i]["input_ids"][:max_len], "loss_mask": ours[i]["loss_mask"][:max_len].long()}
             for i in range(len(ours))]

    class Rows(list):  # iterates as rows (v0.2.0 tag) and indexes by column (later code)
        def __getitem__(self, k):
            return [r[k] for r in self] if isinstance(k, str) else list.__getitem__(self, k)

    vp = generate_vocab_mapping_file(Rows(items), cfg.vocab_size, cfg.draft_vocab_size, cache_dir=tmp, cache_key="k")
    theirs = torch.load(vp)
mine = torch.load(os.path.join(out, "vocab_mapping.pt"))
same = torch.equal(theirs["d2t"], mine["d2t"]) and torch.equal(theirs["t2d"], mine["t2d"])
print(f"[specforge] generate_vocab_mapping_file over the samples == vocab_mapping.pt: {same} "
      f"(d2t {mine['d2t'].dtype} {tuple(mine['d2t'].shape)}, t2d {mine['t2d'].dtype} {tuple(mine['t2d'].shape)})")

torch.manual_seed(0)
draft = AutoDraft.from_config(cfg, attention_backend="sdpa", torch_dtype=torch.float32)
draft.load_embedding(os.path.join(out, "target"), embedding_key="model.embed_tokens.weight")
draft.freeze_embedding()
draft.load_vocab_mapping(os.path.join(out, "vocab_mapping.pt"))
head = TargetHead(os.path.join(out, "target"))
head.load_weights(os.path.join(out, "target"), lm_head_key="lm_head.weight")
head.freeze_weights()
head = head.eval().to(torch.float32)
model = OnlineEagle3Model(draft_model=draft, length=3, attention_backend="sdpa")
# SpecForge's KL loss is a Triton kernel (specforge/core/loss.py LogSoftmaxLoss): no CPU. Its
# module keeps the reference implementation (_compute_loss, same math) beside it; on a CPU the
# step uses that one, and says so.
import specforge.core.loss as sf_loss  # noqa: E402
on_cpu = not torch.cuda.is_available()
if on_cpu:
    class _RefLoss:
        apply = staticmethod(getattr(sf_loss._compute_loss, "_torchdynamo_orig_callable", sf_loss._compute_loss))
    for modname in ("specforge.algorithms.eagle3.model", "specforge.core.eagle3"):
        mod = sys.modules.get(modname)
        if mod is not None and hasattr(mod, "LogSoftmaxLoss"):
            mod.LogSoftmaxLoss = _RefLoss
opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-4)
target = head(batch["target"].float())
input_ids, target, loss_mask = head.preprocess(batch["input_ids"], target, batch["loss_mask"])
res = model(input_ids=input_ids, attention_mask=batch["attention_mask"], loss_mask=loss_mask,
            target=target, hidden_states=batch["hidden_state"].float())
plosses = res[0]  # the rest of the tuple differs between SpecForge versions (trainer_check_bootstrap.py reads it)
loss = sum(0.8 ** i * p for i, p in enumerate(plosses))
loss.backward()
opt.step()
assert all(torch.isfinite(p) for p in plosses)
print(f"[specforge] one CPU training step of LlamaForCausalLMEagle3 (fp32, sdpa, ttt length 3"
      f"{', loss: SpecForge reference _compute_loss in place of its Triton kernel' if on_cpu else ''}): "
      f"losses {[round(float(p), 4) for p in plosses]}")
if not same:
    sys.exit("[specforge] FAIL: the vocab mapping differs from SpecForge's own")
print("[specforge] OK")
