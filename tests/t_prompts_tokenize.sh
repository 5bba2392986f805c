#!/usr/bin/env bash
# eaglegen tokenize: --help, usage errors, golden ids for every record of
# fixtures/tokenizer/encode.jsonl and chat.jsonl, compressed input, bad records named by line.
set -u
cd "$(dirname "$0")/.."
EAGLEGEN=${EAGLEGEN:-$PWD/build/eaglegen}
FIXTURES=${FIXTURES:-$PWD/../shared/fixtures}
PYTHON=${PYTHON:-/usr/bin/python3}
TOK=$FIXTURES/tokenizer
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "  FAIL: $*"; fail=1; }

# --help is complete and exits 0; usage errors exit 2
"$EAGLEGEN" tokenize --help > "$tmp/help" || bad "--help exit status"
for opt in --tokenizer --chat --thinking --no-generation-prompt --loss-mask --allow-media; do
    grep -q -- "$opt" "$tmp/help" || bad "--help does not mention $opt"
done
"$EAGLEGEN" tokenize < /dev/null 2> "$tmp/err"; [ $? -eq 2 ] || bad "missing --tokenizer: want exit 2"
grep -q -- "--tokenizer" "$tmp/err" || bad "missing --tokenizer: message"
"$EAGLEGEN" tokenize --tokenizer "$TOK" --thinking maybe < /dev/null 2>/dev/null; [ $? -eq 2 ] || bad "--thinking maybe: want exit 2"
"$EAGLEGEN" tokenize --tokenizer "$TOK" --bogus < /dev/null 2>/dev/null; [ $? -eq 2 ] || bad "unknown option: want exit 2"
"$EAGLEGEN" tokenize --tokenizer /nonexistent < /dev/null 2> "$tmp/err"; [ $? -eq 1 ] || bad "bad tokenizer dir: want exit 1"
grep -q nonexistent "$tmp/err" || bad "bad tokenizer dir: message should name it"

# encode.jsonl: {"name","text","ids"} records are {"text"} inputs; ids must match exactly
"$EAGLEGEN" tokenize --tokenizer "$TOK" < "$TOK/encode.jsonl" > "$tmp/enc.out" || bad "encode.jsonl run failed"
"$PYTHON" - "$TOK/encode.jsonl" "$tmp/enc.out" <<'EOF' || fail=1
import json, sys
want = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
got = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8")]
assert len(got) == len(want), (len(got), len(want))
bad = [w["name"] for w, g in zip(want, got) if g["ids"] != w["ids"] or "rendered" in g]
print(f"  encode.jsonl via CLI: {len(want) - len(bad)}/{len(want)} match")
sys.exit(1 if bad else 0)
EOF

# chat.jsonl: one run per flag combination; rendered and ids must match every record
"$PYTHON" - "$TOK/chat.jsonl" "$tmp" <<'EOF' > "$tmp/chat.cmds" || fail=1
import json, sys
groups = {}
for l in open(sys.argv[1], encoding="utf-8"):
    r = json.loads(l)
    flags = "--thinking " + ("on" if r["thinking"] else "off")
    if not r["add_generation_prompt"]:
        flags += " --no-generation-prompt"
    groups.setdefault(flags, []).append(r)
for i, (flags, recs) in enumerate(groups.items()):
    with open(f"{sys.argv[2]}/chat{i}.in", "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps({"messages": r["messages"]}, ensure_ascii=False) + "\n")
    with open(f"{sys.argv[2]}/chat{i}.want", "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(i, flags)
EOF
while read -r i flags; do
    # shellcheck disable=SC2086
    "$EAGLEGEN" tokenize --tokenizer "$TOK" $flags < "$tmp/chat$i.in" > "$tmp/chat$i.out" || bad "chat group $i ($flags) failed"
done < "$tmp/chat.cmds"
"$PYTHON" - "$tmp" "$(wc -l < "$tmp/chat.cmds")" <<'EOF' || fail=1
import json, sys
n = ok = 0
for i in range(int(sys.argv[2])):
    want = [json.loads(l) for l in open(f"{sys.argv[1]}/chat{i}.want", encoding="utf-8")]
    got = [json.loads(l) for l in open(f"{sys.argv[1]}/chat{i}.out", encoding="utf-8")]
    for k, r in enumerate(want):
        n += 1
        if k < len(got) and got[k]["rendered"] == r["rendered"] and got[k]["ids"] == r["ids"]:
            ok += 1
        else:
            print(f"  FAIL: chat {r['name']}: rendered/ids differ")
print(f"  chat.jsonl via CLI: {ok}/{n} match")
sys.exit(0 if ok == n and n >= 13 else 1)
EOF

# sample corpus from files and from compressed stdin give identical output
"$EAGLEGEN" tokenize --tokenizer "$TOK" --loss-mask prompts/samples/sample.jsonl > "$tmp/s1" || bad "sample.jsonl failed"
[ "$(wc -l < "$tmp/s1")" -eq "$(grep -c . prompts/samples/sample.jsonl)" ] || bad "sample: one output line per record"
if command -v zstd >/dev/null; then
    zstd -q -c prompts/samples/sample.jsonl | "$EAGLEGEN" tokenize --tokenizer "$TOK" --loss-mask > "$tmp/s2" || bad "zstd stdin failed"
    cmp -s "$tmp/s1" "$tmp/s2" || bad "zstd stdin output differs"
fi
"$PYTHON" - "$tmp/s1" <<'EOF' || fail=1
import json, sys
for l in open(sys.argv[1], encoding="utf-8"):
    g = json.loads(l)
    assert len(g["loss_mask"]) == len(g["ids"]) and set(g["loss_mask"]) <= {0, 1}
EOF

# --chat turns {"text"} into a user turn; --thinking off changes the prefill
echo '{"text": "Hi"}' | "$EAGLEGEN" tokenize --tokenizer "$TOK" --chat --thinking off > "$tmp/c" || bad "--chat failed"
grep -q '"rendered": "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>"' "$tmp/c" \
    || bad "--chat --thinking off rendering: $(cat "$tmp/c")"
# input_ids are decoded back
echo '{"input_ids": [163587, 163586]}' | "$EAGLEGEN" tokenize --tokenizer "$TOK" > "$tmp/d" || bad "input_ids failed"
grep -q '"rendered": "<|im_user|><|im_end|>"' "$tmp/d" || bad "input_ids decode: $(cat "$tmp/d")"

# a bad record stops the run naming the line (after the good ones were written)
printf '{"prompt": "a"}\n\n{"prompt": 3}\n{"prompt": "c"}\n' | "$EAGLEGEN" tokenize --tokenizer "$TOK" > "$tmp/o" 2> "$tmp/err"
[ $? -eq 1 ] || bad "bad record: want exit 1"
grep -q 'stdin:3: "prompt" is not a string' "$tmp/err" || bad "bad record message: $(cat "$tmp/err")"
[ "$(wc -l < "$tmp/o")" -eq 1 ] || bad "records before the bad one are written"
"$EAGLEGEN" tokenize --tokenizer "$TOK" prompts/samples/bad.jsonl > /dev/null 2> "$tmp/err"
grep -q 'prompts/samples/bad.jsonl:1: invalid JSON' "$tmp/err" || bad "bad file message: $(cat "$tmp/err")"

[ $fail -eq 0 ] && echo "  t_prompts_tokenize: ok"
exit $fail
