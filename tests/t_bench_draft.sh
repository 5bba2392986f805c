#!/usr/bin/env bash
# eaglegen bench --draft-model / --replay-drafter (workload mode with speculative decoding):
# nonsense is refused with one clear line (exit 2); a drafter made for another model is
# refused before any row runs (exit 1). With the replay proposer (an oracle replaying the
# plain run's greedy tokens) the counts are known in advance for a workload of equal
# lengths (sigma 0): every request's L - 1 tokens after the first go through verify steps
# of K + 1, so verify steps, drafts, accepted drafts, committed tokens and the accept length
# are asserted exactly, and the target passes are the engine steps. With a random EAGLE-3
# drafter (mkmodel --drafter-for) greedy tokens are those of the plain run, and the report's
# fields agree with each other. The modelled boxes equal `eaglegen plan` at the measured A.
set -eu
: "${EAGLEGEN:?}" "${FIXTURES:?}"
: "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; cat "$tmp/err" 2>/dev/null; exit 1; }
refused() { # rc pattern command...
    local want_rc=$1 want=$2; shift 2
    set +e; "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?; set -e
    [ $rc = "$want_rc" ] || fail "exit $rc (want $want_rc): $*"
    grep -qF -- "$want" "$tmp/err" || fail "want '$want': $*"
    [ "$(wc -l <"$tmp/err")" = 1 ] || fail "more than one line on stderr: $*"
}
cd "$tmp"
$E mkmodel --preset tiny --out model --seed 3 >/dev/null 2>&1
$E mkmodel --drafter-for model --out drafter --seed 5 >/dev/null 2>&1 || fail "mkmodel --drafter-for"
$E mkmodel --drafter-for "$FIXTURES/models/tiny-fp8" --out other >/dev/null 2>&1 || fail "mkmodel --drafter-for tiny-fp8"
wl=(--model model --requests 4 --workload lognormal:21:0 --max-new 64 --kv-tokens 1024 --prompt-len 12 --chunk 32
    --threads 1)

echo "-- flags"
refused 2 "--draft-tokens needs --draft-model DIR" $E bench "${wl[@]}" --draft-tokens 2
refused 2 "--draft-model runs in workload mode (--requests N)" $E bench --model model --draft-model drafter
refused 2 "--replay-drafter runs in workload mode" $E bench --model model --replay-drafter 1
refused 2 "not both" $E bench "${wl[@]}" --draft-model drafter --replay-drafter 1
refused 2 "--replay-drafter expects a number in [0, 1]" $E bench "${wl[@]}" --replay-drafter 1.5
refused 2 "needs --temperature 0" $E bench "${wl[@]}" --replay-drafter 1 --temperature 1
refused 2 "--draft-tokens expects an integer in [1, 64]" $E bench "${wl[@]}" --draft-model drafter --draft-tokens 0
refused 2 "a step of max(--chunk 4, --batch 4) rows cannot hold a verify step of --draft-tokens 4 + 1 rows" $E bench "${wl[@]}" --draft-model drafter \
    --draft-tokens 4 --chunk 4 --batch 4
refused 1 "vocab_size 384 but the target's vocabulary is 512" $E bench "${wl[@]}" --draft-model other
grep -q "^on-demand" "$tmp/out" && fail "rows ran before the drafter for another model was refused"
refused 1 "--draft-model nodir: cannot open nodir/config.json" $E bench "${wl[@]}" --draft-model nodir
$E bench --help >"$tmp/out"
for f in "--draft-model DIR" "--draft-tokens K" "--replay-drafter RATE" "--plan-mean-len N"; do
    grep -qF -- "$f" "$tmp/out" || fail "bench --help lacks $f"
done

echo "-- replay proposer: counts known in advance (4 requests of 21 tokens, K 3)"
for rate in 1 0 0.5; do
    $E bench "${wl[@]}" --replay-drafter $rate --json >"r$rate.json" 2>"$tmp/err" || fail "replay $rate"
done
$E bench "${wl[@]}" --replay-drafter 1 --draft-tokens 5 --kv-policy reserve --json >r1k5.json 2>"$tmp/err" \
    || fail "replay 1, K 5"
for b in rtx-pro-6000x8 h200x8; do
    for k in 3 5; do
        acc=$("$PYTHON" -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')][1]; print(r['accept_length'])" \
            "$([ $k = 3 ] && echo r1.json || echo r1k5.json)")
        $E plan --preset kimi-k2.5 --box $b --mean-len 4096 --draft-tokens $k --accept "$acc" --json >"plan_${b}_$k.json"
        $E plan --preset kimi-k2.5 --box $b --mean-len 4096 --json >"plan_${b}_plain.json"
    done
done
"$PYTHON" - <<'PY' || fail "replay counts"
import json, math
def rows(p):
    return [json.loads(l) for l in open(p) if l.startswith("{")]
R, L, K = 4, 21, 3
def check_pair(p, k, rate, policies):
    rs = rows(p)
    assert [r["run"] for r in rs] == ["plain", "speculative"] * len(policies), [r.get("run") for r in rs]
    assert [r["policy"] for r in rs[::2]] == policies, rs
    for plain, sp in zip(rs[::2], rs[1::2]):
        assert sp["drafter"] == "replay" and sp["draft_tokens"] == k, sp
        assert sp["generated"] == R * L and plain["decode_tokens"] == sp["decode_tokens"] == R * L, (plain, sp)
        assert sp["greedy_identical"] is True and sp["identical_requests"] == R, sp
        assert sp["target_passes"] == sp["steps"] and sp["plain_target_passes"] == plain["steps"], (plain, sp)
        vs = sp["verify_steps"]
        assert sp["drafted"] == k * vs, sp                 # max_new 64 > 21: every step drafts K
        assert sp["spec_tokens"] == R * (L - 1), sp          # the first token comes from the prefill
        assert abs(sp["accept_length"] - sp["spec_tokens"] / vs) < 1e-4, sp
        assert abs(sp["mean_accepted"] - sp["accepted"] / vs) < 1e-4, sp
        assert abs(sp["tokens_per_pass"] - sp["generated"] / sp["steps"]) < 1e-3, sp
        assert abs(sp["draft_share"] + sp["verify_share"] - 1) < 1e-3, sp
        if rate == 1:
            assert vs == R * math.ceil((L - 1) / (k + 1)), (vs, sp)
            # every draft inside the reference is right; past its end (the last step when K + 1
            # does not divide L - 1) a draft is right only by chance
            if (L - 1) % (k + 1) == 0:
                assert sp["accepted"] == sp["drafted"], sp
            else:
                assert sp["accepted"] >= sp["drafted"] - R * (k + 1 - (L - 1) % (k + 1)), sp
            # the plain run's prefill steps at most, then the requests' verify steps side by side
            # instead of L - 1 decode steps (a sequence may start verifying beside a prefill chunk)
            assert sp["steps"] <= plain["steps"] - (L - 1) + math.ceil((L - 1) / (k + 1)), (plain, sp)
        elif rate == 0:
            assert vs == R * (L - 1) and sp["accepted"] == 0 and sp["accept_length"] == 1, sp
            assert sp["steps"] == plain["steps"], (plain, sp)
        else:
            assert 0 < sp["accepted"] < sp["drafted"], sp
            assert R * math.ceil((L - 1) / (k + 1)) < vs < R * (L - 1), sp
    return rs
both = ["on-demand", "reserve"]
r1 = check_pair("r1.json", K, 1, both)
check_pair("r0.json", K, 0, both)
check_pair("r0.5.json", K, 0.5, both)
r5 = check_pair("r1k5.json", 5, 1, ["reserve"])
# the modelled boxes are the layout model's (eaglegen plan) recommended decode rows at the measured A
for rs, k in ((r1, 3), (r5, 5)):
    sp = rs[1]
    assert len(sp["modelled"]) == 2, sp
    for m in sp["modelled"]:
        pl = json.load(open("plan_%s_plain.json" % m["box"]))
        dr = json.load(open("plan_%s_%d.json" % (m["box"], k)))
        def rate(d, name):
            return [x["decode_tok_s"] for x in d["layouts"] if x["layout"] == name][0]
        assert m["plain_layout"] == pl["recommended_decode"], (m, pl["recommended_decode"])
        assert m["spec_layout"] == dr["recommended_decode"], (m, dr["recommended_decode"])
        assert abs(m["plain_decode_tok_s"] - rate(pl, m["plain_layout"])) < 0.1, m
        assert abs(m["spec_decode_tok_s"] - rate(dr, m["spec_layout"])) < 0.1 * max(1, sp["accept_length"]), m
PY

echo "-- an EAGLE-3 drafter (random weights): greedy tokens unchanged, the report consistent"
$E bench "${wl[@]}" --draft-model drafter --draft-tokens 2 --kv-policy on-demand --json >d.json 2>"$tmp/err" \
    || fail "bench --draft-model"
$E bench "${wl[@]}" --draft-model drafter --temperature 1 --kv-policy on-demand --json >ds.json 2>"$tmp/err" \
    || fail "bench --draft-model, sampled"
"$PYTHON" - <<'PY' || fail "drafter report"
import json
for p, greedy in (("d.json", True), ("ds.json", False)):
    plain, sp = [json.loads(l) for l in open(p) if l.startswith("{")]
    assert plain["run"] == "plain" and sp["run"] == "speculative" and sp["drafter"] == "eagle3", sp
    assert sp["greedy_identical"] is (True if greedy else None), sp
    assert sp["generated"] == 4 * 21 and sp["spec_tokens"] == 4 * 20, sp
    assert 0 <= sp["accepted"] <= sp["drafted"] <= sp["draft_tokens"] * sp["verify_steps"], sp
    assert abs(sp["accept_length"] - sp["spec_tokens"] / sp["verify_steps"]) < 1e-4, sp
    assert sp["target_passes"] == sp["steps"] and sp["plain_target_passes"] == plain["steps"], sp
    # greedy: the backend's argmaxes, no logits row to the host; sampled: the rows (the
    # CPU backend leaves the drafts' p to the host)
    assert (sp["logit_rows"] == 0) if greedy else (sp["logit_rows"] > 0 and sp["backend_probs"] == 0), sp
    # and so no step is deferred: nothing drawn there, no residual from its kept sets
    assert sp["backend_draws"] == 0 and sp["backend_residuals"] == 0, sp
    # the drafter runs its own CPU code here: none of its draws is counted as reduced on a backend
    assert sp["draft_kept"] == 0 and sp["draft_argmax"] == 0 and sp["draft_host_rows"] == 0, sp
PY
echo "-- an MLA drafter (vLLM's layout): greedy unchanged, the boxes modelled with Kimi-K2.5's latent cache"
$E mkmodel --drafter-for model --out drafter_mla --seed 5 --mla >/dev/null 2>&1 || fail "mkmodel --drafter-for --mla"
$E bench "${wl[@]}" --draft-model drafter_mla --draft-tokens 2 --kv-policy on-demand --json >dm.json 2>"$tmp/err" \
    || fail "bench --draft-model (MLA)"
acc=$("$PYTHON" -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')][1]; print(r['accept_length'])" dm.json)
for b in rtx-pro-6000x8 h200x8; do
    $E plan --preset kimi-k2.5 --box $b --mean-len 4096 --draft-tokens 2 --accept "$acc" --draft-cache-bytes 1152 \
        --json >"plan_mla_$b.json" || fail "plan --draft-cache-bytes"
done
"$PYTHON" - <<'PY' || fail "MLA drafter report"
import json
plain, sp = [json.loads(l) for l in open("dm.json") if l.startswith("{")]
assert sp["drafter"] == "eagle3" and sp["greedy_identical"] is True, sp
for m in sp["modelled"]:
    dr = json.load(open("plan_mla_%s.json" % m["box"]))
    want = [x["decode_tok_s"] for x in dr["layouts"] if x["layout"] == m["spec_layout"]][0]
    assert m["spec_layout"] == dr["recommended_decode"], (m, dr["recommended_decode"])
    assert abs(m["spec_decode_tok_s"] - want) < 0.1 * max(1, sp["accept_length"]), (m, want)
PY
$E bench "${wl[@]}" --draft-model drafter_mla --kv-policy on-demand >tm.txt 2>"$tmp/err" || fail "text report (MLA)"
grep -q "an MLA drafter (eaglegen plan .* --draft-cache-bytes 1152)" tm.txt || { cat tm.txt; fail "MLA modelled line"; }
echo "-- --ep: the workload rows on an expert-parallel group (the same tokens, the exchange counted)"
refused 2 "--ep and --ep-split run in workload mode" $E bench --model model --ep 2
refused 2 "--ep-split needs an expert-parallel group" $E bench "${wl[@]}" --ep-split ffn
refused 2 "--replay-drafter drives one engine" $E bench "${wl[@]}" --ep 2 --replay-drafter 1
refused 2 "--ep-split expects none, ffn or all" $E bench "${wl[@]}" --ep 2 --ep-split some
$E bench "${wl[@]}" --kv-policy on-demand --json >e1.json 2>"$tmp/err" || fail "bench (one engine)"
$E bench "${wl[@]}" --kv-policy on-demand --ep 2 --json >e2.json 2>"$tmp/err" || fail "bench --ep 2"
$E bench "${wl[@]}" --kv-policy on-demand --ep 2 --ep-split all --json >e3.json 2>"$tmp/err" || fail "bench --ep 2 all"
$E bench "${wl[@]}" --kv-policy on-demand --ep 2 --draft-model drafter_mla --json >e4.json 2>"$tmp/err" ||
    fail "bench --ep 2 --draft-model"
"$PYTHON" - <<'PY' || fail "bench --ep rows"
import json
def rows(p):
    return [json.loads(l) for l in open(p) if l.startswith("{")]
one, two, split = rows("e1.json")[0], rows("e2.json")[0], rows("e3.json")[0]
assert "ep" not in one and two["ep"] == 2 and two["ep_split"] == "none" and split["ep_split"] == "all", (one, two, split)
assert one["decode_tokens"] == two["decode_tokens"] == split["decode_tokens"] == 4 * 21, (one, two, split)
assert two["exchange_pairs"] > 0 and two["exchange_bytes"] > 0, two
assert split["exchange_bytes"] > two["exchange_bytes"], ("the vocab split moves more", two, split)
plain, sp = rows("e4.json")
assert sp["run"] == "speculative" and sp["greedy_identical"] is True and sp["ep"] == 2, sp
PY
$E bench "${wl[@]}" --kv-policy on-demand --ep 2 >t2.txt 2>"$tmp/err" || fail "bench --ep 2 text"
grep -q "expert parallel: 2 ranks (--ep-split none)" t2.txt || { cat t2.txt; fail "bench --ep 2: no group line"; }
$E bench "${wl[@]}" --replay-drafter 0.5 --kv-policy on-demand >t.txt 2>"$tmp/err" || fail "text report"
grep -q "^+drafter" t.txt && grep -q "accept length A" t.txt && grep -q "target passes .* -> " t.txt &&
    grep -q "greedy tokens identical to the plain run: 4 of 4 requests" t.txt &&
    grep -q "modelled Kimi-K2.5 decode at mean length 4096, K 3" t.txt || { cat t.txt; fail "text report lines"; }
echo "t_bench_draft: ok"
