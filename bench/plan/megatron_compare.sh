#!/bin/bash
# Plans every GPT model of Narayanan et al. 2021, Table 1, on the DGX A100 80GB cluster file with the paper's
# GPU count, and prints the planner's best layout next to the paper's (docs/planning.md has the table).
#   bench/plan/megatron_compare.sh      (from the repository root, after building into build/)
set -euo pipefail
BIN=./build/meshtrain
CL=launch/clusters/dgx-a100-80g.toml
printf "| model | GPUs | paper t x p (TFLOP/s/GPU) | plan: best layout | mem/GPU | pred. TFLOP/s/GPU | tp in node | pp across nodes |\n"
printf "|---|---|---|---|---|---|---|---|\n"
# name, GPUs, tensor-parallel size, pipeline-parallel size, TFLOP/s per GPU: Table 1 of the paper
while read -r f g t p tf; do
  job=bench/plan/megatron-$f.toml
  $BIN plan "$job" --cluster $CL --world "$g" --json --top 1 | python3 -c '
import json, sys
d = json.load(sys.stdin); l = d["layouts"][0]
name, g, t, p, tf = sys.argv[1:6]
tok = l["tokens_per_s"]
# model FLOPs per token of the paper (its Eq. 3 counts the same 6N + 12LHQT terms the planner uses)
flops = float(sys.argv[6])
fit = "fits" if l["fits"] else "over by %.1f GiB" % (l["over_bytes"] / 2**30)
lay = "tp%d pp%d dp%d %s b%d m%d%s rc=%s" % (l["tp"], l["pp"], l["dp"], l["engine"], l["micro_batch"], l["microbatches"],
      " sp" if l["sequence_parallel"] else "", l["recompute"])
print("| %s | %s | %s x %s (%s) | %s | %.1f GiB (%s) | %.0f | %s | %s |" % (name, g, t, p, tf, lay,
      l["mem_bytes"]["total"] / 2**30, fit, tok * flops / int(g) / 1e12,
      "yes" if l["tp"] > 1 and not l["cross_node"]["tp"] else ("no tp" if l["tp"] == 1 else "NO"),
      "yes" if l["pp"] > 1 and l["cross_node"]["pp"] else ("no pp" if l["pp"] == 1 else "no")))
' "$f" "$g" "$t" "$p" "$tf" "$(python3 -c "
import re
s = open('$job').read()
L = int(re.search(r'n_layer = (\d+)', s).group(1)); C = int(re.search(r'n_embd = (\d+)', s).group(1))
V, T = 51200, 2048
N = 12 * L * C * C + 13 * L * C + V * C + 2 * C   # matmul-taking parameters as mt_model_flops_per_token counts them
print(6 * N + 12 * L * C * T)")"
done <<'TABLE'
1.7b 32 1 1 137
3.6b 64 2 1 138
7.5b 128 4 1 142
18.4b 256 8 1 135
39.1b 512 8 2 138
76.1b 1024 8 4 140
145.6b 1536 8 8 148
310.1b 1920 8 16 155
529.6b 2520 8 35 163
1t 3072 8 64 163
TABLE
