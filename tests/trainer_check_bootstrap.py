"""The bootstrap's training step: SpecForge trains its EAGLE-3 drafter on an `eaglegen export
--to specforge` directory on the CPU and saves it the way SpecForge saves a drafter.

usage: trainer_check_bootstrap.py EXPORT OUT_DIR STEPS [TTT_LENGTH] [BATCH] [LR]
       (run with the trainer venv's python)

As train_eagle3.py's offline path runs it: build_offline_eagle3_dataset(EXPORT/hidden_states),
DataCollatorWithPadding, AutoDraftModelConfig.from_file(draft_config.json),
AutoEagle3DraftModel.from_config (fp32, sdpa), load_embedding + freeze_embedding (the target's
embedding), load_vocab_mapping(EXPORT/vocab_mapping.pt), TargetHead(EXPORT/target) for the
target logits, OnlineEagle3Model with the test-time-training unroll of TTT_LENGTH (default 3),
loss = sum 0.8^i * ploss_i, AdamW. SpecForge's KL loss is a Triton kernel; on a CPU its
reference `_compute_loss` (same math, in the same module) takes its place, as in
trainer_check_specforge.py. The data are shuffled with a fixed seed; batches of BATCH
(default 4) samples.

Saved as SpecForge saves a drafter (train_eagle3.py's epoch checkpoint, and its serving
exporter specforge.export.to_sglang): draft.save_pretrained(OUT_DIR, state_dict = the
draft's state dict without the frozen embedding), i.e. config.json + model.safetensors
(F32 here: trained in fp32). Nothing else is written into OUT_DIR.

Prints `[bootstrap] loss ...` lines (mean of the weighted loss over each tenth of the steps,
and the per-unroll accuracies of the last tenth) and `[bootstrap] saved DIR`.
"""
import os
import random
import sys

import torch

try:  # the v0.2.0 tag's layout, then the later one (PyPI's specforge 0.2.0 wheel)
    from specforge.core.eagle3 import OnlineEagle3Model
except ImportError:
    from specforge.algorithms.eagle3.model import OnlineEagle3Model
from specforge.data.preprocessing import build_offline_eagle3_dataset
from specforge.data.utils import DataCollatorWithPadding
from specforge.modeling.auto import AutoDraftModelConfig
try:
    from specforge.modeling.auto import AutoEagle3DraftModel as AutoDraft
except ImportError:
    from specforge.modeling.auto import AutoDraftModel as AutoDraft
from specforge.modeling.target.target_head import TargetHead
import specforge.core.loss as sf_loss

exp, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
ttt = int(sys.argv[4]) if len(sys.argv) > 4 else 3
bs = int(sys.argv[5]) if len(sys.argv) > 5 else 4
lr = float(sys.argv[6]) if len(sys.argv) > 6 else 3e-3
if steps < 1 or ttt < 1 or bs < 1 or not lr > 0:
    sys.exit(f"[bootstrap] bad arguments: steps {steps}, ttt {ttt}, batch {bs}, lr {lr}")

torch.manual_seed(0)
random.seed(0)
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
sf = build_offline_eagle3_dataset(os.path.join(exp, "hidden_states"), 4096)
print(f"[bootstrap] OfflineEagle3Dataset: {len(sf)} samples")
cfg = AutoDraftModelConfig.from_file(os.path.join(exp, "draft_config.json"))
draft = AutoDraft.from_config(cfg, attention_backend="sdpa", torch_dtype=torch.float32)
draft.load_embedding(os.path.join(exp, "target"), embedding_key="model.embed_tokens.weight")
draft.freeze_embedding()
draft.load_vocab_mapping(os.path.join(exp, "vocab_mapping.pt"))
head = TargetHead(os.path.join(exp, "target"))
head.load_weights(os.path.join(exp, "target"), lm_head_key="lm_head.weight")
head.freeze_weights()
head = head.eval().to(torch.float32)
model = OnlineEagle3Model(draft_model=draft, length=ttt, attention_backend="sdpa")
on_cpu = not torch.cuda.is_available()
if on_cpu:  # SpecForge's Triton KL kernel has no CPU path: its reference implementation
    class _RefLoss:
        apply = staticmethod(getattr(sf_loss._compute_loss, "_torchdynamo_orig_callable", sf_loss._compute_loss))
    for modname in ("specforge.algorithms.eagle3.model", "specforge.core.eagle3"):
        mod = sys.modules.get(modname)
        if mod is not None and hasattr(mod, "LogSoftmaxLoss"):
            mod.LogSoftmaxLoss = _RefLoss
opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=lr)
collate = DataCollatorWithPadding()
order = []
losses, accs = [], []
model.train()
for step in range(steps):
    if len(order) < bs:
        perm = list(range(len(sf)))
        random.shuffle(perm)
        order += perm
    batch = collate([sf[i] for i in order[:bs]])
    del order[:bs]
    with torch.no_grad():
        target = head(batch["target"].float())
    input_ids, target, loss_mask = head.preprocess(batch["input_ids"], target, batch["loss_mask"])
    res = model(input_ids=input_ids, attention_mask=batch["attention_mask"], loss_mask=loss_mask,
                target=target, hidden_states=batch["hidden_state"].float())
    plosses = res[0]
    acces = res[2] if len(res) >= 7 else res[-1]  # later code: (plosses, rates, acces, ...); v0.2.0: (plosses, vlosses, acces)
    loss = sum(0.8 ** i * p for i, p in enumerate(plosses))
    opt.zero_grad()
    loss.backward()
    opt.step()
    if not torch.isfinite(loss.detach()):
        sys.exit(f"[bootstrap] FAIL: loss {float(loss)} at step {step}")
    losses.append(loss.item())
    accs.append([float(a.detach()) if torch.is_tensor(a) else float(a) for a in acces])
tenth = max(1, steps // 10)
curve = [sum(losses[i:i + tenth]) / len(losses[i:i + tenth]) for i in range(0, steps, tenth)]
last = accs[-tenth:]
acc_last = [round(sum(a[j] for a in last) / len(last), 3) for j in range(len(last[0]))]
print(f"[bootstrap] trained {steps} steps (batch {bs}, TTT length {ttt}, AdamW lr {lr}, fp32, sdpa"
      f"{', loss: SpecForge reference _compute_loss' if on_cpu else ''})")
print(f"[bootstrap] loss by tenth of the steps: {' '.join(f'{c:.3f}' for c in curve)}")
print(f"[bootstrap] accuracy per TTT unroll over the last tenth: {acc_last}")

state = {k: v for k, v in draft.state_dict().items() if "embed" not in k.lower()}
try:  # SpecForge's serving exporter's own check of the names (later code only)
    from specforge.export.to_sglang import WEIGHT_MAPS, _serving_state
    state = _serving_state(state, WEIGHT_MAPS.get(type(draft).__name__, {}))
except ImportError:
    pass
draft.save_pretrained(out, state_dict=state)
try:
    from specforge.export.checkpoint_io import apply_legacy_rope_scaling
    apply_legacy_rope_scaling(out)
except ImportError:
    pass
print(f"[bootstrap] saved {out}: {sorted(os.listdir(out))}")
