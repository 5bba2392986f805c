"""The bootstrap's training step with speculators: its EAGLE-3 drafter trained on an
`eaglegen export --to speculators` directory on the CPU and saved as speculators saves one.

usage: trainer_check_bootstrap_speculators.py EXPORT VERIFIER_DIR OUT_DIR STEPS [LR]
       (run with the speculators venv's python)

The drafter is built from the command the export printed (eaglegen_export.json), parsed by
speculators' TrainConfig.resolve and build_draft_model (verifier config, target_layer_ids,
d2t/t2d from --data-path), as tests/trainer_check_speculators.py does; the batches come from
create_train_val_loaders (ArrowDataset + CollateFn + shift_batch). Each step is the one
speculators' Trainer takes (forward with the trainer kwargs: TTT unroll and loss, backward,
clip 1.0, AdamW), in fp32 (speculators' Trainer itself needs CUDA). Saved with the model's
own save_pretrained(OUT_DIR): config.json (Eagle3SpeculatorConfig: speculators_model_type
eagle3, transformer_layer_config, eagle_aux_hidden_state_layer_ids in vLLM's k + 1 count)
and model.safetensors (layers.0.*, embed_tokens, d2t, t2d), loaded by eaglegen as saved.

Prints `[bootstrap] ...` lines: the loss by tenth of the steps and the saved files."""
import json
import os
import shlex
import sys
from pathlib import Path

import torch
from hs_connectors import FileTransfer
from speculators.model import SpeculatorModel
from speculators.models.eagle3.data import shift_batch
from speculators.train import cli as spcli
from speculators.train.config import TrainConfig
from speculators.train.dataloader import create_train_val_loaders

ex, verifier, out, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
lr = float(sys.argv[5]) if len(sys.argv) > 5 else 3e-3
if steps < 1 or not lr > 0:
    sys.exit(f"[bootstrap] bad arguments: steps {steps}, lr {lr}")
torch.manual_seed(0)
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
prov = json.load(open(os.path.join(ex, "eaglegen_export.json")))
argv = shlex.split(prov["command"])
if argv[:2] != ["speculators", "train"]:
    sys.exit(f"[bootstrap] FAIL: the export's command is {argv[:2]}")
argv = argv[2:]
argv[argv.index("--verifier-name-or-path") + 1] = verifier
# packed batches of 1024 tokens (the default 8192 makes each CPU step's attention 64x dearer)
argv += ["--save-path", out + ".ckpt", "--num-workers", "0", "--draft-attn-impl", "sdpa", "--loss-implementation",
         "eager", "--train-data-ratio", "0.95", "--total-seq-len", "1024",
         "--mask-token-id", str(json.load(open(os.path.join(verifier, "config.json")))["pad_token_id"])]
cfg = TrainConfig.resolve(argv)
args = __import__("argparse").Namespace(**cfg.flatten())
d2t, t2d, nvocab = spcli.parse_vocab_mappings(args)
model_class = SpeculatorModel.registry[args.speculator_type]
model = spcli.build_draft_model(args, model_class, t2d, d2t, nvocab).float()
H = json.load(open(os.path.join(verifier, "config.json")))["hidden_size"]
na = len(prov["aux_layers"]["target_layer_ids"])
loader, _ = create_train_val_loaders(
    data_path=ex, total_seq_len=args.total_seq_len, hidden_states_dtype=torch.float32,
    transfer=FileTransfer(Path(ex) / "hidden_states"), vllm_endpoint=args.vllm_endpoint, on_missing="raise",
    verifier_name_or_path=verifier, request_timeout=None, max_retries=0, generation_validation_retries=0,
    max_consecutive_generation_failures=1, hidden_size=H, num_target_layers=na, num_workers=0, prefetch_factor=None,
    preprocess=shift_batch, train_data_ratio=0.95, seed=0)
train_kwargs, _ = model_class.get_trainer_kwargs(**vars(args))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
model.train()
losses, it = [], iter(loader)
for step in range(steps):
    try:
        batch = next(it)
    except StopIteration:
        it = iter(loader)
        batch = next(it)
    b = {k: (v.float() if v.is_floating_point() else v) for k, v in batch.items() if isinstance(v, torch.Tensor)}
    _draft, loss, _metrics = model(**b, **train_kwargs)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if not torch.isfinite(loss.detach()):
        sys.exit(f"[bootstrap] FAIL: loss {float(loss)} at step {step}")
    losses.append(float(loss.detach()))
    if (step + 1) % max(1, steps // 10) == 0:
        print(f"[progress] step {step + 1}/{steps}: loss {losses[-1]:.3f}", flush=True)
tenth = max(1, steps // 10)
curve = [sum(losses[i:i + tenth]) / len(losses[i:i + tenth]) for i in range(0, steps, tenth)]
print(f"[bootstrap] speculators' {type(model).__name__}: target_layer_ids {list(model.target_layer_ids)}, draft vocab "
      f"{nvocab}; trained {steps} steps (packed batches of {args.total_seq_len} tokens, AdamW lr {lr}, fp32, sdpa)")
print(f"[bootstrap] loss by tenth of the steps: {' '.join(f'{c:.3f}' for c in curve)}")
model.save_pretrained(out)
print(f"[bootstrap] saved {out}: {sorted(os.listdir(out))}")

# speculators' own forward (two TTT steps, eval) on one exported row against
# tests/ref/eagle3_ref.py reading the saved checkpoint (the reference test_engine_drafter
# holds eaglegen's drafter to): step 0 at every position (fc after norm_before_fc, the layer
# with norm_before_residual, the head), step 1 (the hidden fed back after norm_output, the
# token after next, attention over the committed keys and its own) at every position but the
# last. Positions as at inference: 0-based, +1 per step (speculators adds 1 per step too).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
import eagle3_ref  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
import numpy as np  # noqa: E402

hsf = load_file(os.path.join(ex, "hidden_states", "hs_0.safetensors"))
hs, ids = hsf["hidden_states"].float(), hsf["token_ids"].long()
n = hs.shape[0] - 1
aux = hs[:n, :na, :]  # [n, n_aux, H]: the aux planes of positions 0..n-1
nxt = ids[1:n + 1]    # the token at position t + 1
got = []
hook = model.lm_head.register_forward_hook(lambda m, i, o: got.append(o.detach().double()[0].numpy()))
model.eval()
with torch.no_grad():
    model(hidden_states=aux.reshape(1, n, na * H), input_ids=nxt.unsqueeze(0),
          document_ids=torch.zeros(1, n, dtype=torch.long), position_ids=torch.arange(n).unsqueeze(0), ttt_steps=2)
hook.remove()
if len(got) != 2:
    sys.exit(f"[bootstrap] FAIL: {len(got)} lm_head calls in a 2-step forward")
cfgj = json.load(open(os.path.join(out, "config.json")))
flags = {k: cfgj.get(k) for k in ("norm_before_fc", "norm_before_residual", "norm_output")}


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


worst0 = worst1 = 0.0
ref = eagle3_ref.Drafter(out, verifier, kv_bf16=False)  # speculators keeps K and V in FP32
pre = []
for t in range(n):
    pre.append(ref.layer(int(nxt[t]), ref.hidden_in(aux[t].double().numpy()), t))
    worst0 = max(worst0, rel(got[0][t], ref.logits(pre[-1])))
for t in range(n - 1):
    r = eagle3_ref.Drafter(out, verifier, kv_bf16=False)
    for u in range(t + 1):
        p_u = r.layer(int(nxt[u]), r.hidden_in(aux[u].double().numpy()), u)
    worst1 = max(worst1, rel(got[1][t], r.logits(r.layer(int(nxt[t + 1]), r.chained(p_u), t + 1))))
# the sliding window (speculators' default 2048 covers the whole row): 8 positions, step 0
# (from step 1 on speculators' training mask counts the window from the row's index while
# inference, vLLM's and eaglegen's, counts it from the draft's position, one further)
worstw = 0.0
if getattr(model, "uses_sliding_window_attn", False):
    model.sliding_window, got = 8, []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: got.append(o.detach().double()[0].numpy()))
    with torch.no_grad():
        model(hidden_states=aux.reshape(1, n, na * H), input_ids=nxt.unsqueeze(0),
              document_ids=torch.zeros(1, n, dtype=torch.long), position_ids=torch.arange(n).unsqueeze(0), ttt_steps=1)
    hook.remove()
    r = eagle3_ref.Drafter(out, verifier, kv_bf16=False)
    r.window = 8
    for t in range(n):
        worstw = max(worstw, rel(got[0][t], r.logits(r.layer(int(nxt[t]), r.hidden_in(aux[t].double().numpy()), t))))
print(f"[bootstrap] speculators' forward vs tests/ref/eagle3_ref.py on the saved drafter ({flags}), {n} positions: "
      f"step 0 rel {worst0:.2e}, step 1 rel {worst1:.2e}, step 0 with a sliding window of 8 rel {worstw:.2e} (bound 1e-4)")
if not (worst0 < 1e-4 and worst1 < 1e-4 and worstw < 1e-4):
    sys.exit("[bootstrap] FAIL: eaglegen's reference drafter does not compute speculators' drafter")
