// Stage 09: TMA + wgmma with warp specialization (FP16 and BF16 in and out, FP32 accumulation;
// exactly sm_90a), with causal masking, grouped-query heads, Nq != Nk and the log-sum-exp.
//
// Structural tests (tests/structural_tests.cmake, SOURCE stages/09_wgmma_tma/wgmma_tma.cu, ARCH 90a):
// the PTX must hold the Hopper instructions the stage is about:
//   wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.f16\.f16   (and \.bf16\.bf16; S = Q·Kᵀ and O += P·V,
//                                                                  the latter with A in registers)
//   cp\.async\.bulk\.tensor\.3d\.shared::cluster\.global...   (TMA loads, completing on an mbarrier)
//   cp\.async\.bulk\.tensor\.3d\.global\.shared::cta...       (the TMA store of O)
//   mbarrier\.arrive\.expect_tx   mbarrier\.try_wait\.parity   setmaxnreg\.dec   setmaxnreg\.inc
//   fence\.proxy\.async\.shared::cta
// and ptxas must report 0 bytes of spill for every kernel of the file.
// (In SASS: HGMMA.64x128x16.F32 and .BF16, UTMALDG.3D, UTMASTG.3D, SYNCS.*, USETMAXREG.)
// Besides the contract: the Hopper cases of tests/hopper_cases.cpp (every bucket, the padded path,
// causal and general shapes in every bucket, the descriptor), which stage 10 runs too. On a GPU
// that is not sm_90 every GPU test case here reports skipped (require_stage_runnable).
#include "catch_compat.hpp"
#include "fa/stages.hpp"
#include "gpu_contract.hpp"
#include "hopper_cases.hpp"

FA_GPU_STAGE_CONTRACT("stage09", fa::stages::wgmma_tma_fp16, fa::stages::wgmma_tma_bf16)
FA_HOPPER_STAGE_CASES("stage09", fa::stages::wgmma_tma_fp16, fa::stages::wgmma_tma_bf16)
