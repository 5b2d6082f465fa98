#!/bin/sh
# Static per-loop instruction counts of the fused decode attention kernels (issue 11, docs/BENCH.md
# "Per-kernel budget"): the Vulkan shaders compiled as shaders/meson.build does (plus -g for source
# lines), inlined by spirv-opt -O, and kvq_cuda_flash's PTX from nvcc -lineinfo. For each loop
# (SPIR-V: OpLoopMerge header to merge block; PTX: a backward branch to its target) it prints the
# source lines the loop covers and its own body's instructions (nested loops excluded), by class.
# Static counts of the loop body, each instruction once whatever branch runs: not a profile.
# Two builds: $out/as-built (the sources as they are) and $out/paged (a scratch copy of the sources
# with the ring window's read replaced by 0, and for CUDA the method fixed at compile time per
# method, so that a loop holds only the page path of one method, as a warp of page tokens runs it).
# Not run by any test; changes nothing in the tree. Usage: scripts/kernel-budget.sh [outdir]
# (needs glslangValidator, spirv-opt, spirv-dis, python3; nvcc at $NVCC or /usr/local/cuda/bin/nvcc)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-/tmp/kvq-kernel-budget}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
rm -rf "$out/as-built" "$out/paged" "$out/src"; mkdir -p "$out/as-built" "$out/paged" "$out/src"
cp -r "$root/core" "$root/backends" "$root/include" "$root/shaders" "$out/src/"
sed -i -e 's/kvq_window_value(t, kvh, c)/0.0/' -e 's/kvq_window_at(token.x + c)/0.0/' "$out/src/shaders/flash_logits.comp" "$out/src/shaders/flash_values.comp"
f="$out/src/backends/cuda/kernels/flash.cuh"
sed -i -e 's/kvq_cuda_flash(const kvq_cuda_attention a, const kvq_cuda_side values,/kvq_cuda_flash(const kvq_cuda_attention a_in, const kvq_cuda_side values_in,/' \
  -e 's/^  KVQ_SHARED(float, part, KVQ_CUDA_BLOCK_WARPS);$/&\n  kvq_cuda_attention a = a_in; a.side.method = KVQ_BUDGET_METHOD; kvq_cuda_side values = values_in; values.method = KVQ_BUDGET_VMETHOD;/' \
  -e 's/kvq_cuda_window_value(a, meta, key_ring, seq, t, kvh, c)/0.0f/' \
  -e 's/kvq_cuda_window_value(av, meta, value_ring, seq, ti, kvh, c)/0.0f/' "$f"
grep -q KVQ_BUDGET_METHOD "$f" || { echo "kernel-budget.sh: flash.cuh changed, the paged specialisation no longer applies" >&2; exit 1; }
build() { # source root, output folder
  for m in exact qjl uniform kivi polar cq; do
    M=$(echo $m | tr a-z A-Z)
    for s in flash_logits flash_values; do
      glslangValidator -V -g --target-env vulkan1.2 -I"$1" -I"$1/shaders" -DKVQ_METHOD=KVQ_LAYOUT_$M \
        -DKVQ_VK_METHOD_$M=1 "$1/shaders/$s.comp" -o "$2/${s}_$m.spv" >/dev/null
    done
  done
  glslangValidator -V -g --target-env vulkan1.2 -I"$1" -I"$1/shaders" "$1/shaders/flash_combine.comp" \
    -o "$2/flash_combine.spv" >/dev/null
  for f in "$2"/*.spv; do
    spirv-opt -O "$f" -o "${f%.spv}.opt"
    spirv-dis "${f%.spv}.opt" > "${f%.spv}.spvasm"
  done
}
build "$root" "$out/as-built"
build "$out/src" "$out/paged"
if [ -x "$NVCC" ]; then
  (cd "$root" && "$NVCC" -arch=sm_90 -lineinfo -I. -ptx backends/cuda/kernels/kernels_check.cu -o "$out/as-built/kernels.ptx")
  i=0
  for m in exact qjl uniform kivi polar cq; do
    v=$i; [ $m = polar ] && v=0 # PolarQuant values never take the fused path: exact values with its keys
    (cd "$out/src" && "$NVCC" -arch=sm_90 -lineinfo -I. -DKVQ_BUDGET_METHOD=${i}u -DKVQ_BUDGET_VMETHOD=${v}u -ptx \
      backends/cuda/kernels/kernels_check.cu -o "$out/paged/kernels_$m.ptx")
    i=$((i + 1))
  done
fi
for d in as-built paged; do
echo "######## $d"
python3 - "$out/$d" <<'PY'
import re, sys, glob, os
out = sys.argv[1]

def classify_spv(op):
    if op in ('OpLoad',): return 'load'
    if op in ('OpStore', 'OpAtomicIAdd'): return 'store'
    if op in ('OpUDiv', 'OpSDiv', 'OpUMod', 'OpSMod', 'OpSRem'): return 'divmod'
    if op in ('OpConvertUToF', 'OpConvertSToF', 'OpConvertFToU', 'OpConvertFToS', 'OpFConvert', 'OpUConvert',
              'OpSConvert', 'OpQuantizeToF16'): return 'conv'
    if op.startswith('OpF') and not op.startswith('OpFOrd') and not op.startswith('OpFUnord') and op != 'OpFunctionCall':
        return 'float'
    if op in ('OpVectorTimesScalar', 'OpDot'): return 'float'
    if op in ('OpIAdd', 'OpISub', 'OpIMul', 'OpShiftLeftLogical', 'OpShiftRightLogical', 'OpShiftRightArithmetic',
              'OpBitwiseAnd', 'OpBitwiseOr', 'OpBitwiseXor', 'OpNot', 'OpBitFieldUExtract', 'OpBitFieldSExtract',
              'OpBitFieldInsert', 'OpSNegate', 'OpBitCount'): return 'int'
    if op.startswith('OpFOrd') or op.startswith('OpFUnord') or op in ('OpULessThan', 'OpULessThanEqual',
              'OpUGreaterThan', 'OpUGreaterThanEqual', 'OpSLessThan', 'OpSLessThanEqual', 'OpSGreaterThan',
              'OpSGreaterThanEqual', 'OpIEqual', 'OpINotEqual', 'OpLogicalAnd', 'OpLogicalOr', 'OpLogicalNot',
              'OpLogicalEqual', 'OpLogicalNotEqual', 'OpSelect', 'OpIsNan', 'OpIsInf'): return 'cmp/sel'
    if op in ('OpBranch', 'OpBranchConditional', 'OpSwitch', 'OpPhi', 'OpReturn', 'OpKill'): return 'ctrl'
    if op in ('OpAccessChain', 'OpInBoundsAccessChain', 'OpPtrAccessChain'): return 'addr'
    if op in ('OpBitcast', 'OpCopyObject', 'OpCompositeExtract', 'OpCompositeConstruct', 'OpCompositeInsert',
              'OpVectorShuffle', 'OpUndef'): return 'free'
    if op == 'OpExtInst': return 'ext'
    if op in ('OpControlBarrier', 'OpMemoryBarrier'): return 'barrier'
    if op.startswith('OpGroupNonUniform'): return 'subgroup'
    return 'other:' + op

SKIP = {'OpLabel', 'OpLoopMerge', 'OpSelectionMerge', 'OpLine', 'OpNoLine', 'OpFunctionEnd', 'OpFunction',
        'OpFunctionParameter', 'OpVariable'}
CLASSES = ['total', 'load', 'store', 'divmod', 'conv', 'float', 'int', 'cmp/sel', 'addr', 'ctrl', 'other']

def spv_report(path):
    lines = open(path).read().split('\n')
    strings = {}
    for l in lines:
        mm = re.match(r'\s*(%\S+) = OpString "(.*)"', l)
        if mm: strings[mm.group(1)] = os.path.basename(mm.group(2))
    # main only (spirv-opt -O inlines everything)
    start = next(i for i, l in enumerate(lines) if re.search(r'%main = OpFunction', l))
    body = lines[start:]
    labels = {}
    for i, l in enumerate(body):
        mm = re.match(r'\s*(%\S+) = OpLabel', l)
        if mm: labels[mm.group(1)] = i
    loops = []
    for i, l in enumerate(body):
        mm = re.search(r'OpLoopMerge (%\S+) (%\S+)', l)
        if mm:
            h = max(j for j in range(i) if 'OpLabel' in body[j])
            loops.append((h, labels[mm.group(1)]))
    res = []
    for (a, b) in loops:
        nested = [(x, y) for (x, y) in loops if a < x and y <= b]
        cnt = {k: 0 for k in CLASSES}; ext = {}; src = set(); cur = None
        for j in range(a, b):
            l = body[j]
            mm = re.search(r'OpLine (%\S+) (\d+)', l)
            if mm: cur = (strings.get(mm.group(1), '?'), int(mm.group(2)))
            if any(x <= j < y for (x, y) in nested): continue
            mm = re.match(r'\s*(?:%\S+ = )?(Op\w+)', l)
            if not mm or mm.group(1) in SKIP: continue
            op = mm.group(1); c = classify_spv(op)
            if c == 'ext':
                e = re.search(r'OpExtInst %\S+ %\S+ (\w+)', l).group(1)
                ext[e] = ext.get(e, 0) + 1
                c = 'conv' if 'Pack' in e else 'float' if e in ('Fma', 'Exp', 'Exp2', 'FMax', 'FMin', 'FAbs', 'Sqrt',
                     'InverseSqrt', 'Atan2', 'Sin', 'Cos', 'Log', 'NMax', 'NMin', 'FClamp', 'Trunc', 'Floor', 'Round',
                     'RoundEven', 'Ldexp', 'FSign') else 'int'
            if c == 'free': continue
            if c.startswith('other') or c in ('barrier', 'subgroup'): c = 'other'
            cnt[c] += 1; cnt['total'] += 1
            if cur: src.add(cur)
        res.append((a, len(nested), cnt, ext, src))
    return res

def fmt_src(src):
    byf = {}
    for f, n in src: byf.setdefault(f, []).append(n)
    return ' '.join('%s:%d-%d' % (f, min(v), max(v)) for f, v in sorted(byf.items()))

print('# SPIR-V (spirv-opt -O, main inlined); per loop: own body (nested loops excluded)')
print('# columns: ' + ' '.join(CLASSES) + ' | nested loops | source lines | GLSL.std.450 ext')
for f in sorted(glob.glob(os.path.join(out, '*.spvasm'))):
    print('== ' + os.path.basename(f))
    for (a, nn, cnt, ext, src) in spv_report(f):
        print('  loop@%-5d %s | nested %d | %s | %s' % (a, ' '.join('%s=%d' % (k, cnt[k]) for k in CLASSES), nn,
              fmt_src(src), ext))

def classify_ptx(op):
    base = op.split('.')[0]
    if base in ('ld', 'ldu', 'tex'): return 'load'
    if base in ('st', 'atom', 'red'): return 'store'
    if base in ('div', 'rem') and not any(t in op for t in ('.f32', '.f64', '.rn', '.full', '.approx')): return 'divmod'
    if base == 'cvt' or base == 'cvta': return 'conv'
    if any(t in op for t in ('.f32', '.f16', '.f64', '.bf16', '.ftz')) and base not in ('setp', 'selp', 'mov'): return 'float'
    if base in ('setp', 'selp', 'and', 'or', 'xor', 'not') and '.pred' in op: return 'cmp/sel'
    if base in ('setp', 'selp', 'set'): return 'cmp/sel'
    if base in ('bra', 'ret', 'bar', 'exit'): return 'ctrl'
    if base == 'mov': return 'mov'
    return 'int'
def ptx_report(ptx):
  lines = open(ptx).read().split('\n')
  files = {}
  for l in lines:
      mm = re.match(r'\s*\.file\s+(\d+)\s+"(.*?)"', l)
      if mm: files[mm.group(1)] = os.path.basename(mm.group(2))
  for kernel in ('kvq_cuda_flash18', 'kvq_cuda_flash_combine'):
      s = next(i for i, l in enumerate(lines) if '.entry' in l and kernel in l)
      e = next(i for i in range(s + 1, len(lines)) if lines[i].startswith('}'))
      body = lines[s:e]
      labels = {}
      for i, l in enumerate(body):
          mm = re.match(r'(\$L__\w+):', l)
          if mm: labels[mm.group(1)] = i
      loops = []
      for i, l in enumerate(body):
          mm = re.search(r'\bbra(?:\.uni)?\s+(\$L__\w+);', l)
          if mm and labels.get(mm.group(1), 1 << 30) < i: loops.append((labels[mm.group(1)], i + 1))
      print('# PTX %s (nvcc -arch=sm_90 -lineinfo -ptx): loops = backward branches; own body, nested excluded' % kernel)
      PC = ['total', 'load', 'store', 'divmod', 'conv', 'float', 'int', 'cmp/sel', 'mov', 'ctrl']
      for (a, b) in sorted(loops):
          nested = [(x, y) for (x, y) in loops if (x, y) != (a, b) and a <= x and y <= b]
          cnt = {k: 0 for k in PC}; src = set(); cur = None; ops = {}
          for j in range(a, b):
              l = body[j].strip()
              mm = re.match(r'\.loc\s+(\d+)\s+(\d+)', l)
              if mm: cur = (files.get(mm.group(1), '?'), int(mm.group(2)))
              if any(x <= j < y for (x, y) in nested): continue
              if not l or l.startswith(('.', '$', '/', '{', '}')): continue
              op = re.sub(r'^@!?%\w+\s+', '', l).split()[0].rstrip(';')
              c = classify_ptx(op); cnt[c] += 1; cnt['total'] += 1
              if c == 'divmod': ops[op] = ops.get(op, 0) + 1
              if cur: src.add(cur)
          print('  loop@%-5d %s | nested %d | %s | divmod %s' % (a, ' '.join('%s=%d' % (k, cnt[k]) for k in PC), len(nested),
                fmt_src(src), ops))
for ptx in sorted(glob.glob(os.path.join(out, 'kernels*.ptx'))):
  print('== ' + os.path.basename(ptx))
  ptx_report(ptx)
PY
done
