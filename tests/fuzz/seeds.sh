#!/usr/bin/env bash
# seeds.sh OUT EAGLEGEN — writes seed inputs for every fuzz target into OUT/NAME/ from the
# fixtures (../shared/fixtures or $FIXTURES) and from a small dataset generated with
# EAGLEGEN (tiny random model, prompts/samples). Used by run.sh; tests/fuzz/corpus holds
# the small committed subset.
set -eu
out=$1 E=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
fx=${FIXTURES:-$root/../shared/fixtures}
for t in safetensors config corpus_record corpus_stream tokenizer chat record shard manifest ledger; do
    mkdir -p "$out/$t"
done
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# safetensors: small fixture files whole
for f in "$fx"/models/tiny-*/*.safetensors; do cp "$f" "$out/safetensors/$(basename "$(dirname "$f")")-$(basename "$f")"; done
# config.json of each fixture model
for d in "$fx"/models/tiny-*/; do cp "$d/config.json" "$out/config/$(basename "$d").json"; done
# corpus records: one line each from the samples and the tokenizer fixtures
i=0
for f in "$root"/prompts/samples/*.jsonl "$fx"/tokenizer/chat.jsonl; do
    while IFS= read -r line; do
        i=$((i + 1))
        printf '%s' "$line" > "$out/corpus_record/l$i"
        { printf '\001'; printf '%s' "$line"; } > "$out/chat/c$i"
        [ $i -ge 400 ] && break 2
    done < "$f"
done
# tokenizer: texts of encode.jsonl (byte 0 = flags)
"${PYTHON:-python3}" - "$fx/tokenizer/encode.jsonl" "$out/tokenizer" <<'PY'
import json, sys
for i, line in enumerate(open(sys.argv[1], encoding="utf-8")):
    if i >= 200: break
    r = json.loads(line)
    t = r.get("text", "")
    open(f"{sys.argv[2]}/t{i}", "wb").write(bytes([i & 1]) + t.encode("utf-8"))
PY
# streams: plain, CRLF, BOM, gz, zst, xz, bz2
s=$root/prompts/samples/sample.jsonl
head -c 3000 "$s" > "$out/corpus_stream/plain"
sed 's/$/\r/' "$out/corpus_stream/plain" > "$out/corpus_stream/crlf"
{ printf '\xef\xbb\xbf'; cat "$out/corpus_stream/plain"; } > "$out/corpus_stream/bom"
gzip -c "$out/corpus_stream/plain" > "$out/corpus_stream/gz"
zstd -q -c "$out/corpus_stream/plain" > "$out/corpus_stream/zst"
xz -c "$out/corpus_stream/plain" > "$out/corpus_stream/xz"
bzip2 -c "$out/corpus_stream/plain" > "$out/corpus_stream/bz2"
# a generated dataset: records, shard, manifest, ledger, job file
( cd "$tmp"
  "$E" mkmodel --preset tiny --out model --seed 3 >/dev/null 2>&1
  head -n 6 "$root/prompts/samples/sample.jsonl" > c.jsonl
  printf '{"prompt": 5}\n' >> c.jsonl
  "$E" generate --model model --prompts c.jsonl --out ds --max-new-tokens 4 --max-seq-len 256 --threads 1 \
       --shard-samples 3 --on-bad-record=skip >/dev/null 2>&1
  mkdir x && tar -xf ds/shard-000000.tar -C x )
for f in "$tmp"/x/*.egs; do { printf '\000'; cat "$f"; } > "$out/record/$(basename "$f")"; done
cp "$tmp"/ds/shard-*.tar "$out/shard/"
cp "$tmp/ds/manifest.json" "$out/manifest/manifest.json"
{ printf '\000'; cat "$tmp/ds/rejects.jsonl"; } > "$out/ledger/rejects"
{ printf '\001'; cat "$tmp/ds/job.json"; } > "$out/ledger/job"
