# Zero warnings: every target gets these, host and device code alike. FA_WERROR (the CI preset)
# makes every warning an error: the host compiler's, nvcc's own and ptxas's (a spill among them).
function(fa_target_warnings target)
  set(host_flags -Wall -Wextra -Wshadow)
  string(JOIN "," host_flags_csv ${host_flags})
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${host_flags}>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${host_flags_csv} -Xptxas=-warn-spills --expt-relaxed-constexpr>)
  if(FA_WERROR)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Werror>
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror>
      $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
  endif()
endfunction()
