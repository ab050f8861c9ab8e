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
