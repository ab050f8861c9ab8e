# Zero warnings: every target gets these, host and device code alike.
function(fa_target_warnings target)
  set(host_flags -Wall -Wextra -Wshadow)
  string(JOIN "," host_flags_csv ${host_flags})
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${host_flags}>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${host_flags_csv} -Xptxas=-warn-spills --expt-relaxed-constexpr>)
  if(FA_WERROR)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Werror>
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror>)
  endif()
endfunction()
