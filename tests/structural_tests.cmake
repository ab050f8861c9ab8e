# Structural tests (design.md): the compiled PTX of a stage whose idea is about how the kernel
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
# The D = 128 two-strip kernel runs at the 255-register limit, and fits it on sm_80 and sm_90.
foreach(arch 80 90)
  fa_add_spill_test(NAME "stage08: ptxas spills nothing to local memory (sm_${arch})"
    STAGE 08_mma_registers SOURCE mma_registers.cu ARCH ${arch})
endforeach()
