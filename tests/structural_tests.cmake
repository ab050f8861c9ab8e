# Structural tests (DESIGN.md): the compiled PTX of a stage whose idea is about how the kernel
# runs must contain the instructions of that idea. They run in CI without a GPU.
foreach(arch 75 90)
  fa_add_structural_test(NAME "stage05: PTX has 128-bit global and shared accesses (sm_${arch})"
    STAGE 05_float4 SOURCE float4_tiles.cu ARCH ${arch}
    PATTERN "ld\\.global(\\.nc)?\\.v4\\.f32" PATTERN "ld\\.shared\\.v4\\.f32" PATTERN "st\\.shared\\.v4\\.f32")
  fa_add_structural_test(NAME "stage06: PTX issues tensor-core WMMA instructions (sm_${arch})"
    STAGE 06_wmma SOURCE wmma_attention.cu ARCH ${arch}
    PATTERN "wmma\\.mma\\.sync\\.aligned\\.row\\.col\\.m16n16k16\\.f32\\.f32"
    PATTERN "wmma\\.mma\\.sync\\.aligned\\.row\\.row\\.m16n16k16\\.f32\\.f32")
endforeach()
# Stage 07 needs sm_80 (cp.async): its PTX is checked for sm_80 and sm_90 only.
foreach(arch 80 90)
  fa_add_structural_test(NAME "stage07: PTX issues cp.async copies and waits (sm_${arch})"
    STAGE 07_fp16_pipelined SOURCE fp16_pipelined.cu ARCH ${arch}
    PATTERN "cp\\.async\\.cg\\.shared\\.global"
    PATTERN "cp\\.async\\.commit_group" PATTERN "cp\\.async\\.wait_group [0-9]+"
    PATTERN "wmma\\.mma\\.sync\\.aligned\\.row\\.col\\.m16n16k16\\.f32\\.bf16\\.bf16\\.f32")
  # Three blocks per SM cap the D = 128 kernels at 168 registers, close to what O, Q and the
  # scores need: a spill there would cost a local-memory round trip per tile.
  fa_add_spill_test(NAME "stage07: ptxas spills nothing to local memory (sm_${arch})"
    STAGE 07_fp16_pipelined SOURCE fp16_pipelined.cu ARCH ${arch})
endforeach()
# Stage 08 needs sm_80 (mma.m16n8k16 in BF16, cp.async): raw tensor-core instructions in both
# precisions, ldmatrix (plain for Q and K, transposing for V), the cp.async ring, and no spills.
foreach(arch 80 90)
  fa_add_structural_test(NAME "stage08: PTX issues mma.sync, ldmatrix and cp.async (sm_${arch})"
    STAGE 08_mma_registers SOURCE mma_registers.cu ARCH ${arch}
    PATTERN "mma\\.sync\\.aligned\\.m16n8k16\\.row\\.col\\.f32\\.f16\\.f16\\.f32"
    PATTERN "mma\\.sync\\.aligned\\.m16n8k16\\.row\\.col\\.f32\\.bf16\\.bf16\\.f32"
    PATTERN "ldmatrix\\.sync\\.aligned\\.m8n8\\.x4\\.shared\\.b16"
    PATTERN "ldmatrix\\.sync\\.aligned\\.m8n8\\.x4\\.trans\\.shared\\.b16"
    PATTERN "cp\\.async\\.cg\\.shared\\.global"
    PATTERN "cp\\.async\\.commit_group" PATTERN "cp\\.async\\.wait_group [0-9]+")
endforeach()
# The spill test assembles every kernel of the file: for each head-dim bucket (64, 96, 128, 192,
# 256) and precision, the kernel at the bucket's own D, the padded one and the synchronous one. The
# D = 96 and 128 two-strip kernels and the D = 192 eight-warp kernel run at or near the
# 255-register limit, and fit it on sm_80 and sm_90. The pattern test checks that the PTX holds
# the kernel of each bucket's own D, so that the spill test covers every bucket.
foreach(arch 80 90)
  fa_add_structural_test(NAME "stage08: PTX holds a kernel for every head-dim bucket (sm_${arch})"
    STAGE 08_mma_registers SOURCE mma_registers.cu ARCH ${arch}
    PATTERN "mma_attention_kernel[A-Za-z0-9_]*Li64ELb1ELb1E" PATTERN "mma_attention_kernel[A-Za-z0-9_]*Li96ELb1ELb1E"
    PATTERN "mma_attention_kernel[A-Za-z0-9_]*Li128ELb1ELb1E"
    PATTERN "mma_attention_kernel[A-Za-z0-9_]*Li192ELb1ELb1E"
    PATTERN "mma_attention_kernel[A-Za-z0-9_]*Li256ELb1ELb1E")
  fa_add_spill_test(NAME "stage08: ptxas spills nothing to local memory (sm_${arch})"
    STAGE 08_mma_registers SOURCE mma_registers.cu ARCH ${arch})
endforeach()
# Stage 09 is sm_90a only (wgmma, setmaxnreg): its PTX is checked for that target alone. Both
# products as wgmma in both precisions (S = Q·Kᵀ with both operands in shared memory at Bc = 128,
# O += P·V with P in registers: the D = 128 bucket), TMA loads and the TMA store, the mbarrier
# protocol, the register hand-over between the roles and the proxy fence before the TMA store.
fa_add_structural_test(NAME "stage09: PTX issues wgmma, TMA copies, mbarrier waits and setmaxnreg (sm_90a)"
  STAGE 09_wgmma_tma SOURCE wgmma_tma.cu ARCH 90a
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n128k16\\.f32\\.f16\\.f16"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n128k16\\.f32\\.bf16\\.bf16"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n128k16\\.f32\\.f16\\.f16 [{][^}]*[}], [{]%r[0-9]+, %r[0-9]+, %r[0-9]+, %r[0-9]+[}]"
  PATTERN "wgmma\\.commit_group\\.sync\\.aligned" PATTERN "wgmma\\.wait_group\\.sync\\.aligned"
  PATTERN "cp\\.async\\.bulk\\.tensor\\.3d\\.shared::cluster\\.global\\.tile\\.mbarrier::complete_tx::bytes"
  PATTERN "cp\\.async\\.bulk\\.tensor\\.3d\\.global\\.shared::cta\\.tile\\.bulk_group"
  PATTERN "mbarrier\\.arrive\\.expect_tx\\.shared::cta\\.b64" PATTERN "mbarrier\\.try_wait\\.parity\\.shared::cta\\.b64"
  PATTERN "setmaxnreg\\.dec\\.sync\\.aligned\\.u32 24" PATTERN "setmaxnreg\\.inc\\.sync\\.aligned\\.u32 240"
  PATTERN "fence\\.proxy\\.async\\.shared::cta")
# The consumers' O (up to 128 FP32 registers at D = 256), S and P live in registers: no kernel may spill.
fa_add_spill_test(NAME "stage09: ptxas spills nothing to local memory (sm_90a)"
  STAGE 09_wgmma_tma SOURCE wgmma_tma.cu ARCH 90a)
# Stage 11 needs sm_80: the backward's five products as mma.sync in both precisions, ldmatrix plain
# and transposing, the cp.async ring, and dQ's FP32 atomic adds. dK and dV for a warp's 32 keys live
# in registers beside S^T and dP^T (about 250 at D = 128): no kernel may spill.
foreach(arch 80 90)
  fa_add_structural_test(NAME "stage11: PTX issues mma.sync, ldmatrix, cp.async and FP32 atomic adds (sm_${arch})"
    STAGE 11_backward SOURCE backward_mma.cu ARCH ${arch}
    PATTERN "mma\\.sync\\.aligned\\.m16n8k16\\.row\\.col\\.f32\\.f16\\.f16\\.f32"
    PATTERN "mma\\.sync\\.aligned\\.m16n8k16\\.row\\.col\\.f32\\.bf16\\.bf16\\.f32"
    PATTERN "ldmatrix\\.sync\\.aligned\\.m8n8\\.x4\\.shared\\.b16"
    PATTERN "ldmatrix\\.sync\\.aligned\\.m8n8\\.x4\\.trans\\.shared\\.b16"
    PATTERN "cp\\.async\\.cg\\.shared\\.global"
    PATTERN "(red|atom)\\.global\\.add(\\.v4)?\\.f32")
  fa_add_spill_test(NAME "stage11: ptxas spills nothing to local memory (sm_${arch})"
    STAGE 11_backward SOURCE backward_mma.cu ARCH ${arch})
endforeach()
# On sm_90 dQ's adds go four floats at once (atomicAdd on float4), a warp's 512 bytes side by side in
# the workspace; and at D = 64, P^T and dS^T go to shared memory by stmatrix (ldmatrix's mirror).
fa_add_structural_test(NAME "stage11: dQ's atomic adds go in 16-byte vectors (sm_90)"
  STAGE 11_backward SOURCE backward_mma.cu ARCH 90 PATTERN "(red|atom)\\.global\\.add\\.v4\\.f32")
fa_add_structural_test(NAME "stage11: P^T and dS^T are stored with stmatrix (sm_90)"
  STAGE 11_backward SOURCE backward_mma.cu ARCH 90 PATTERN "stmatrix\\.sync\\.aligned\\.m8n8\\.x4\\.shared\\.b16")
# Stage 10 is stage 09 with FlashAttention-3's schedule: besides stage 09's instructions, a
# wgmma.wait_group 1 (the wait for S that leaves P·V running) and the turn-taking named barriers
# (bar.sync and bar.arrive with a thread count). No kernel may spill: S of one tile, P of the last
# one and O are live at once.
fa_add_structural_test(NAME "stage10: PTX overlaps S with P·V (wait_group 1) and takes turns at named barriers (sm_90a)"
  STAGE 10_overlap SOURCE overlap.cu ARCH 90a
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n128k16\\.f32\\.f16\\.f16"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n128k16\\.f32\\.bf16\\.bf16"
  PATTERN "wgmma\\.wait_group\\.sync\\.aligned 1" PATTERN "bar\\.arrive %r[0-9]+, %r[0-9]+"
  PATTERN "cp\\.async\\.bulk\\.tensor\\.3d\\.shared::cluster\\.global\\.tile\\.mbarrier::complete_tx::bytes"
  PATTERN "setmaxnreg\\.inc\\.sync\\.aligned\\.u32 240")
fa_add_spill_test(NAME "stage10: ptxas spills nothing to local memory (sm_90a)"
  STAGE 10_overlap SOURCE overlap.cu ARCH 90a)
# The overlap as the machine runs it: in every stage-10 kernel of D = 128 and 256 the softmax's
# exponentials lie between the wait for S (wgmma.wait_group 1, P·V still running) and the wait for
# P·V. ptxas 13.0 hoisted that wait above them while both shared a basic block (stage 10's README,
# "What the compiler made of it"); the test reads the SASS (cuobjdump, PyPI nvidia-cuda-cuobjdump).
# The D = 64 kernels run three consumers without the overlap (Tiling::kOverlap): they must wait for
# both products at once, never for S alone.
fa_add_sass_test(NAME "stage10: SASS runs the softmax's exponentials between the wait for S and the wait for P·V (sm_90a)"
  STAGE 10_overlap SOURCE overlap.cu ARCH 90a SCRIPT ${PROJECT_SOURCE_DIR}/tests/sass_overlap_check.py
  ARGS --plain-dims 64)
# wgmma reads its matrix descriptors from uniform registers: in stages 10, 12 and 13 the round loop
# keeps them there, without an R2UR (stage 10's README, "The last round": 12 a round cost 7 %).
# Stage 09 reads its warpgroup from threadIdx.x and moves them every round (8-32 R2UR).
fa_add_sass_test(NAME "stage10: SASS keeps the round loop's matrix descriptors in uniform registers (sm_90a)"
  STAGE 10_overlap SOURCE overlap.cu ARCH 90a SCRIPT ${PROJECT_SOURCE_DIR}/tests/sass_round_loop_check.py)
# Stage 12 needs sm_80: stage 08's mma.sync, ldmatrix and cp.async, now in a split-KV kernel of each
# head-dim bucket (64, 128, 256) beside the merge kernel; up to D = 128 also the kernel whose warps
# split the keys (Lb1ELb1E: async copies, keys across warps), and the merge whose four warps share a
# row (Li4E). O of one 16-row strip (up to 128 FP32 registers at D = 256), Q's fragments up to
# D = 128 and S live in registers: no kernel may spill.
foreach(arch 80 90)
  fa_add_structural_test(NAME "stage12: PTX issues mma.sync, ldmatrix and cp.async in every bucket, and a merge kernel (sm_${arch})"
    STAGE 12_split_kv SOURCE split_kv.cu ARCH ${arch}
    PATTERN "mma\\.sync\\.aligned\\.m16n8k16\\.row\\.col\\.f32\\.f16\\.f16\\.f32"
    PATTERN "mma\\.sync\\.aligned\\.m16n8k16\\.row\\.col\\.f32\\.bf16\\.bf16\\.f32"
    PATTERN "ldmatrix\\.sync\\.aligned\\.m8n8\\.x4\\.shared\\.b16"
    PATTERN "ldmatrix\\.sync\\.aligned\\.m8n8\\.x4\\.trans\\.shared\\.b16"
    PATTERN "cp\\.async\\.cg\\.shared\\.global"
    PATTERN "split_kv_kernel[A-Za-z0-9_]*Li64ELb1E" PATTERN "split_kv_kernel[A-Za-z0-9_]*Li128ELb1E"
    PATTERN "split_kv_kernel[A-Za-z0-9_]*Li256ELb1E" PATTERN "merge_partials_kernel"
    PATTERN "split_kv_kernel[A-Za-z0-9_]*Li64ELb1ELb1E" PATTERN "split_kv_kernel[A-Za-z0-9_]*Li128ELb1ELb1E"
    PATTERN "merge_partials_kernel[A-Za-z0-9_]*Li128ELi4E")
  fa_add_spill_test(NAME "stage12: ptxas spills nothing to local memory (sm_${arch})"
    STAGE 12_split_kv SOURCE split_kv.cu ARCH ${arch})
endforeach()
# On sm_90 the split kernel lets the merge kernel launch early, and the merge kernel waits for it
# (programmatic dependent launch); sm_80 has neither instruction. The merge reads the partials with
# ordinary loads (the file's only FP32 loads): ptxas may move a read-only (ld.global.nc) load above
# griddepcontrol.wait.
fa_add_structural_test(NAME "stage12: the merge kernel launches early, waits for the split kernel, then reads its partials coherently (sm_90)"
  STAGE 12_split_kv SOURCE split_kv.cu ARCH 90
  PATTERN "griddepcontrol\\.launch_dependents" PATTERN "griddepcontrol\\.wait" PATTERN "ld\\.global\\.f32")
# On an H100 or H200 a tile of more than one strip runs on wgmma (split_kv_wgmma.cu, sm_90a alone):
# S = Q·Kᵀ at 64 keys with both operands in shared memory and O += P·V with P in registers (the
# D = 128 bucket), in both precisions; the cp.async ring fenced for the async proxy before wgmma
# reads it; the early launch of the merge. O (64 FP32 registers at D = 128) and S stay in registers.
fa_add_structural_test(NAME "stage12: on Hopper a 64-row tile runs on wgmma, its cp.async ring fenced for the async proxy (sm_90a)"
  STAGE 12_split_kv SOURCE split_kv_wgmma.cu ARCH 90a
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n64k16\\.f32\\.f16\\.f16"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n64k16\\.f32\\.bf16\\.bf16"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n128k16\\.f32\\.f16\\.f16 [{][^}]*[}], [{]%r[0-9]+, %r[0-9]+, %r[0-9]+, %r[0-9]+[}]"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n128k16\\.f32\\.bf16\\.bf16 [{][^}]*[}], [{]%r[0-9]+, %r[0-9]+, %r[0-9]+, %r[0-9]+[}]"
  PATTERN "cp\\.async\\.cg\\.shared\\.global" PATTERN "fence\\.proxy\\.async\\.shared::cta"
  PATTERN "griddepcontrol\\.launch_dependents")
fa_add_spill_test(NAME "stage12: the wgmma kernel spills nothing to local memory (sm_90a)"
  STAGE 12_split_kv SOURCE split_kv_wgmma.cu ARCH 90a)
fa_add_sass_test(NAME "stage12: SASS keeps the wgmma kernel's round-loop descriptors in uniform registers (sm_90a)"
  STAGE 12_split_kv SOURCE split_kv_wgmma.cu ARCH 90a SCRIPT ${PROJECT_SOURCE_DIR}/tests/sass_round_loop_check.py)
# Stage 13 is sm_90a only: the backward's five products as wgmma in both precisions (at D = 128:
# Sᵀ and dPᵀ with both operands K-major in shared memory, dV and dK with Pᵀ and dSᵀ as register A
# operands and dO, Q read MN-major, dQ with both operands read MN-major), the TMA ring and the bulk
# copies of a step's LSE and D, the register hand-over, the proxy fence before wgmma reads dSᵀ,
# dQ's 16-byte atomic adds from the accumulators, the acquire loads of the deterministic mode's
# turn counters, and the programmatic dependent launch of the three kernels (each lets the next one
# start, each waits before reading what the one before wrote). At D = 256: Sᵀ and dPᵀ of 32 queries
# (m64n32k16, both K-major), dV and dK with Pᵀ and dSᵀ read K-major from shared memory (m64n128k16,
# B MN-major), and the cluster of two blocks: dSᵀ copied into the partner's shared memory by the copy
# engine (an address from `mapa`, the bulk shared-to-shared copy), the cluster barrier.
fa_add_structural_test(NAME "stage13: PTX issues the five products as wgmma, the TMA ring, setmaxnreg, dQ's 16-byte atomic adds, dK and dV by TMA store, the cluster's dS exchange and the dependent launch (sm_90a)"
  STAGE 13_wgmma_backward SOURCE wgmma_backward.cu ARCH 90a
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n32k16\\.f32\\.f16\\.f16 [{][^}]*[}], %rd[0-9]+, %rd[0-9]+, p, 1, 1, 0, 0"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n32k16\\.f32\\.bf16\\.bf16 [{][^}]*[}], %rd[0-9]+, %rd[0-9]+, p, 1, 1, 0, 0"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n128k16\\.f32\\.f16\\.f16 [{][^}]*[}], %rd[0-9]+, %rd[0-9]+, 1, 1, 1, 0, 1"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n128k16\\.f32\\.bf16\\.bf16 [{][^}]*[}], %rd[0-9]+, %rd[0-9]+, 1, 1, 1, 0, 1"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n64k16\\.f32\\.f16\\.f16 [{][^}]*[}], %rd[0-9]+, %rd[0-9]+, p, 1, 1, 0, 0"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n64k16\\.f32\\.bf16\\.bf16 [{][^}]*[}], %rd[0-9]+, %rd[0-9]+, p, 1, 1, 0, 0"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n128k16\\.f32\\.f16\\.f16 [{][^}]*[}], [{]%r[0-9]+, %r[0-9]+, %r[0-9]+, %r[0-9]+[}], %rd[0-9]+, 1, 1, 1, 1"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n128k16\\.f32\\.bf16\\.bf16 [{][^}]*[}], [{]%r[0-9]+, %r[0-9]+, %r[0-9]+, %r[0-9]+[}], %rd[0-9]+, 1, 1, 1, 1"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n64k16\\.f32\\.f16\\.f16 [{][^}]*[}], %rd[0-9]+, %rd[0-9]+, p, 1, 1, 1, 1"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n64k16\\.f32\\.bf16\\.bf16 [{][^}]*[}], %rd[0-9]+, %rd[0-9]+, p, 1, 1, 1, 1"
  PATTERN "cp\\.async\\.bulk\\.tensor\\.3d\\.shared::cluster\\.global\\.tile\\.mbarrier::complete_tx::bytes"
  PATTERN "cp\\.async\\.bulk\\.shared::cluster\\.global\\.mbarrier::complete_tx::bytes"
  PATTERN "cp\\.async\\.bulk\\.tensor\\.3d\\.global\\.shared::cta\\.tile\\.bulk_group"
  PATTERN "mbarrier\\.try_wait\\.parity\\.shared::cta\\.b64"
  PATTERN "setmaxnreg\\.dec\\.sync\\.aligned\\.u32 24" PATTERN "setmaxnreg\\.inc\\.sync\\.aligned\\.u32 240"
  PATTERN "fence\\.proxy\\.async\\.shared::cta"
  PATTERN "(red|atom)\\.global\\.add\\.v4\\.f32" PATTERN "ld\\.acquire\\.gpu\\.global\\.b32"
  PATTERN "mapa\\.shared::cluster\\.u32"
  PATTERN "cp\\.async\\.bulk\\.shared::cluster\\.shared::cta\\.mbarrier::complete_tx::bytes"
  PATTERN "barrier\\.cluster\\.arrive" PATTERN "barrier\\.cluster\\.wait"
  PATTERN "griddepcontrol\\.launch_dependents" PATTERN "griddepcontrol\\.wait")
# dK and dV (128 FP32 registers a thread at D = 128), Sᵀ, dPᵀ and their 16-bit copies live in
# registers: no kernel may spill.
fa_add_spill_test(NAME "stage13: ptxas spills nothing to local memory (sm_90a)"
  STAGE 13_wgmma_backward SOURCE wgmma_backward.cu ARCH 90a)
fa_add_sass_test(NAME "stage13: SASS keeps the round loops' matrix descriptors in uniform registers (sm_90a)"
  STAGE 13_wgmma_backward SOURCE wgmma_backward.cu ARCH 90a SCRIPT ${PROJECT_SOURCE_DIR}/tests/sass_round_loop_check.py)
# Stage 14 (FP8, sm_90a; not a stage of the registry: stages/14_fp8/CMakeLists.txt registers its
# source folder): both products as e4m3 wgmma (S from shared memory at 64, 128 and 192 keys, O += P·V
# with P from registers in every bucket), the TMA ring, setmaxnreg, and P quantized in registers by
# cvt.rn.satfinite.e4m3x2. S, P and O live in registers: no kernel may spill.
fa_add_structural_test(NAME "stage14: PTX runs both products as e4m3 wgmma, the TMA ring, setmaxnreg and P's e4m3 conversion (sm_90a)"
  STAGE 14_fp8 SOURCE fp8_attention.cu ARCH 90a
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n192k32\\.f32\\.e4m3\\.e4m3 [{][^}]*[}], %rd[0-9]+, %rd[0-9]+, p, 1, 1"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n128k32\\.f32\\.e4m3\\.e4m3 [{][^}]*[}], %rd[0-9]+, %rd[0-9]+, p, 1, 1"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n64k32\\.f32\\.e4m3\\.e4m3 [{][^}]*[}], %rd[0-9]+, %rd[0-9]+, p, 1, 1"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n128k32\\.f32\\.e4m3\\.e4m3 [{][^}]*[}], [{]%r[0-9]+, %r[0-9]+, %r[0-9]+, %r[0-9]+[}], %rd[0-9]+, 1, 1, 1"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n256k32\\.f32\\.e4m3\\.e4m3 [{][^}]*[}], [{]%r[0-9]+, %r[0-9]+, %r[0-9]+, %r[0-9]+[}], %rd[0-9]+, 1, 1, 1"
  PATTERN "wgmma\\.mma_async\\.sync\\.aligned\\.m64n64k32\\.f32\\.e4m3\\.e4m3 [{][^}]*[}], [{]%r[0-9]+, %r[0-9]+, %r[0-9]+, %r[0-9]+[}], %rd[0-9]+, 1, 1, 1"
  PATTERN "wgmma\\.wait_group\\.sync\\.aligned 1"
  PATTERN "cp\\.async\\.bulk\\.tensor\\.3d\\.shared::cluster\\.global\\.tile\\.mbarrier::complete_tx::bytes"
  PATTERN "cp\\.async\\.bulk\\.tensor\\.3d\\.global\\.shared::cta\\.tile\\.bulk_group"
  PATTERN "setmaxnreg\\.inc\\.sync\\.aligned\\.u32 240" PATTERN "setmaxnreg\\.dec\\.sync\\.aligned\\.u32 24"
  PATTERN "cvt\\.rn\\.satfinite\\.e4m3x2\\.f32")
fa_add_spill_test(NAME "stage14: ptxas spills nothing to local memory in the FP8 forward (sm_90a)"
  STAGE 14_fp8 SOURCE fp8_attention.cu ARCH 90a)
# The same in the machine code: every FP8 kernel issues both products as e4m3 QGMMA (S with A from
# shared memory, P·V with P in registers) and no 16-bit HGMMA; and, as in stage 10, the softmax's
# exponentials run between the wait for S and the wait for P·V (every bucket overlaps here).
fa_add_sass_test(NAME "stage14: SASS runs both products as e4m3 QGMMA and no 16-bit HGMMA (sm_90a)"
  STAGE 14_fp8 SOURCE fp8_attention.cu ARCH 90a SCRIPT ${PROJECT_SOURCE_DIR}/tests/sass_fp8_wgmma_check.py)
fa_add_sass_test(NAME "stage14: SASS runs the softmax's exponentials between the wait for S and the wait for P·V (sm_90a)"
  STAGE 14_fp8 SOURCE fp8_attention.cu ARCH 90a SCRIPT ${PROJECT_SOURCE_DIR}/tests/sass_overlap_check.py)
fa_add_structural_test(NAME "stage14: PTX of the quantization pass converts with cvt.rn.satfinite.e4m3x2 (sm_90a)"
  STAGE 14_fp8 SOURCE quantize.cu ARCH 90a
  PATTERN "cvt\\.rn\\.satfinite\\.e4m3x2\\.f32" PATTERN "shfl\\.sync\\.bfly\\.b32" PATTERN "atom\\.global\\.max\\.u32")
fa_add_spill_test(NAME "stage14: ptxas spills nothing to local memory in the quantization pass (sm_90a)"
  STAGE 14_fp8 SOURCE quantize.cu ARCH 90a)
