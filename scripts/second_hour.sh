#!/usr/bin/env bash
# Issue 36's reproductions, rerun: what a new user hit after the demo, each command and what it prints now.
#
#     bash scripts/second_hour.sh [OUT]     # default results/cpu/second_hour.txt
#
# Run it in a fresh environment made as the README says (pip install -e ., no extras), so that item 1 meets the
# install without matplotlib that the issue met; it says which environment it ran in. About two minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/cpu/second_hour.txt}
TMP=$(mktemp -d)
P='def fib(n):'
run() {  # run "what it checks" command...: the command, its exit status and its output's last lines
  local what=$1; shift
  local t0=$SECONDS
  { echo "## $what"; echo "\$ $*"; } >>"$OUT"
  "$@" >"$TMP/out" 2>&1
  local rc=$?
  tail -n 14 "$TMP/out" | sed 's/^/    /' >>"$OUT"
  echo "    [exit $rc, $((SECONDS - t0)) s]" >>"$OUT"
  echo >>"$OUT"
}
py=$(command -v python)
has_mpl=$(python -c 'import matplotlib' 2>/dev/null && echo yes || echo no)
{
  echo "# Issue 36's reproductions, rerun: bash scripts/second_hour.sh"
  echo "# $(date -u +%F), commit $(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty), python $py, matplotlib installed: $has_mpl"
  echo
} >"$OUT"

run "1. serve-bench without matplotlib: warns before measuring, prints the report, skips the plot" \
  minispec serve-bench --rates 8 --requests 16,16 --gamma 4 --draft tiny-code-draft --out "$TMP/sb"
run "1. roofline --plot without matplotlib: the table, then how to get the plot" minispec roofline --plot "$TMP/r.png"
run "2. a huge gamma: capped at max_new_tokens - 1 with one warning" \
  minispec generate "$P" --draft tiny-code-draft --gamma 1000 --max-new-tokens 32
run "2. the same through the API: gamma 10**6, 8 new tokens" python -c "
import time, minispec
t, tok = minispec.load('tiny-code-target'); d, _ = minispec.load('tiny-code-draft')
s = time.perf_counter(); out = minispec.speculative_generate(t, d, [tok.encode('def fib(n):')], gamma=10**6, max_new_tokens=8)
print(f'{len(out.tokens[0])} tokens in {time.perf_counter() - s:.2f} s; drafted per step:', out.stats.draft_tokens / out.stats.num_drafts)"
run "3. temperature 0 with top-p: warned once" minispec generate "$P" --temperature 0 --top-p 0.9 --max-new-tokens 8
run "4. a negative rate, both spellings: one error naming the rate, before any load" \
  minispec serve-bench --rates -1,4
run "4. (the = spelling)" minispec serve-bench --rates=-1,4
run "4. --help: plain text, every default" minispec --help
run "4. the empty prompt: refused before any model loads" minispec generate ""
run "5. the embedded model after a short code opening: a hint when the output is only whitespace" \
  minispec generate "$P" --max-new-tokens 24
run "5. ... and with a temperature" minispec generate "$P" --max-new-tokens 48 --temperature 0.8 --seed 1
run "6. the demo: three acceptance figures explained, carets under accepted text" minispec demo
run "7. serve-bench with a tree: rows named after the tree, to the end; --no-simulate says nothing was simulated" \
  minispec serve-bench --rates 8 --requests 16,16 --draft tiny-code-draft --tree budget=8,depth=3 --no-simulate \
  --out "$TMP/sbt"
rm -rf "$TMP"
echo "wrote $OUT"
