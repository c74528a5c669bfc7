include_guard(GLOBAL)
# One precompiled <torch/torch.h> for the programs of this build (examples, benchmarks, tests):
# parsing it costs about 10 s of CPU per translation unit, loading it about 3 s, so the fresh
# build of the test command is minutes shorter on 2 cores. Not used by the installed libraries.
# gcc accepts a precompiled header only where it was built with the same -fPIC/-fPIE setting and
# parses the header again (a -Winvalid-pch warning) otherwise: users are position-independent
# executables, or libraries compiled as such (torchpilot_use_torch_pch sets that).
option(TORCHPILOT_TORCH_PCH "Precompile <torch/torch.h> for the examples, benchmarks and tests" ON)
if(TORCHPILOT_TORCH_PCH AND Torch_FOUND)
  add_library(torchpilot_torch_pch OBJECT ${CMAKE_CURRENT_LIST_DIR}/torch_pch.cpp)
  target_link_libraries(torchpilot_torch_pch PRIVATE ${TORCH_LIBRARIES})
  set_target_properties(torchpilot_torch_pch PROPERTIES POSITION_INDEPENDENT_CODE OFF)
  target_compile_options(torchpilot_torch_pch PRIVATE ${CMAKE_CXX_COMPILE_OPTIONS_PIE})
  target_precompile_headers(torchpilot_torch_pch PRIVATE <torch/torch.h>)
endif()

# Compiles `target` with the precompiled <torch/torch.h> (a static library among them as
# position-independent-executable code: it is linked only into this build's executables).
function(torchpilot_use_torch_pch target)
  if(NOT TARGET torchpilot_torch_pch)
    return()
  endif()
  get_target_property(_type ${target} TYPE)
  if(NOT _type STREQUAL "EXECUTABLE")
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
    target_compile_options(${target} PRIVATE ${CMAKE_CXX_COMPILE_OPTIONS_PIE})
  endif()
  target_precompile_headers(${target} REUSE_FROM torchpilot_torch_pch)
endfunction()
