#!/usr/bin/env bash
# docs/doctor.md's side-by-side table (issue #46): four static model-file auditors and `genprobe doctor --only audit`
# on SmolLM2's GGUF and the planted copies of benchmarks/doctor_planted.py. The auditors live in their own venv:
#   python3 -m venv /tmp/auditors && /tmp/auditors/bin/pip install c4nary==0.3.1 ggufdoctor==0.3.0 \
#       aisbom-cli==1.7.0 castlearq==0.6.0
#   python benchmarks/doctor_planted.py /tmp/planted && bash benchmarks/doctor_auditors.sh /tmp/planted
set -u
DIR=${1:-/tmp/planted}; A=${AUDITORS:-/tmp/auditors/bin}; OUT=$DIR/auditors; mkdir -p "$OUT"
export AISBOM_OFFLINE=1 AISBOM_NO_TELEMETRY=1 HF_HUB_OFFLINE=1
CLEAN=$(ls ~/.cache/genprobe/models/*SmolLM2*.gguf | head -1)
py=${PYTHON:-python}
for f in "$CLEAN" "$DIR"/*.gguf; do
  n=$(basename "$f" .gguf)
  timeout 300 "$A/c4nary" scan --json "$f" > "$OUT/$n.c4nary.json" 2>/dev/null; c4=$?
  c4ids=$($py -c "import json,sys; d=json.load(open(sys.argv[1])); print(' '.join(sorted({x['rule_id'] for x in d['findings'] if x['severity'] in ('FAIL','WARN')})) or '-')" "$OUT/$n.c4nary.json" 2>/dev/null)
  timeout 300 "$A/ggufdoctor" "$f" > "$OUT/$n.ggufdoctor.txt" 2>&1; gd=$?
  gdids=$(grep -oE '^ *[A-Z][0-9]{3} +ERROR' "$OUT/$n.ggufdoctor.txt" | awk '{print $1}' | sort -u | tr '\n' ' ')
  rm -rf "$OUT/aisbom-$n"; mkdir -p "$OUT/aisbom-$n"; ln "$f" "$OUT/aisbom-$n/" 2>/dev/null || cp "$f" "$OUT/aisbom-$n/"
  (cd "$OUT" && timeout 300 "$A/aisbom" scan "aisbom-$n" > "$OUT/$n.aisbom.txt" 2>&1); ab=$?
  abrisk=$(grep -oE 'CRITICAL \([^│]*|HIGH \([^│]*|LOW|PASS' "$OUT/$n.aisbom.txt" | head -1)
  store=$OUT/castle-$n; rm -rf "$store"
  timeout 300 "$A/castlearq" import "$f" --model-store "$store" > /dev/null 2>&1
  timeout 300 "$A/castlearq" validate "$(basename "$f")" --model-store "$store" > "$OUT/$n.castlearq.txt" 2>&1; ca=$?
  casafety=$(grep -oE 'safety: [A-Z]+' "$OUT/$n.castlearq.txt" | head -1)
  PYTHONPATH=${GENPROBE_SRC:-src} timeout 300 ${GENPROBE:-genprobe} doctor "$f" --only audit --out "$OUT/doctor-$n" > /dev/null 2>&1; gp=$?
  gpids=$($py -c "import json,sys; d=json.load(open(sys.argv[1])); print(' '.join(f['check'] for f in d['findings'] if f['severity'] in ('bug','warning')) or '-')" "$OUT/doctor-$n/doctor.json" 2>/dev/null)
  echo "| $n | $c4 ${c4ids} | $gd ${gdids:--} | $ab ${abrisk:-?} | $ca ${casafety:-?} | $gp ${gpids:-?} |"
done
