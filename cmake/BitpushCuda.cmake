# BITPUSH_WITH_CUDA = AUTO | ON | OFF
#   AUTO: use CUDA if a toolkit is found at BITPUSH_CUDA_ROOT (default /usr/local/cuda).
#   ON:   CUDA is required; a missing toolkit is a configure error.
#   OFF:  never use CUDA.
# Sets BITPUSH_HAVE_CUDA / BITPUSH_HAVE_NCCL (0/1) for the generated config header
# (build/generated/bitpush/config.h). Only BITPUSH_CUDA_ROOT is searched, so the switch
# behaves the same on every machine.
set(BITPUSH_WITH_CUDA "AUTO" CACHE STRING "Build CUDA/NCCL code: AUTO, ON or OFF")
set_property(CACHE BITPUSH_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)
set(BITPUSH_CUDA_ROOT "/usr/local/cuda" CACHE PATH "CUDA toolkit (with NCCL) to build against")
string(TOUPPER "${BITPUSH_WITH_CUDA}" _bp_cuda)
if(NOT _bp_cuda MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "BITPUSH_WITH_CUDA must be AUTO, ON or OFF (got '${BITPUSH_WITH_CUDA}')")
endif()

set(BITPUSH_HAVE_CUDA 0)
set(BITPUSH_HAVE_NCCL 0)
if(NOT _bp_cuda STREQUAL "OFF")
  if(EXISTS "${BITPUSH_CUDA_ROOT}/bin/nvcc")
    set(CUDAToolkit_ROOT "${BITPUSH_CUDA_ROOT}")
    find_package(CUDAToolkit QUIET)
  endif()
  if(CUDAToolkit_FOUND)
    set(BITPUSH_HAVE_CUDA 1)
    find_path(BITPUSH_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} NO_DEFAULT_PATH)
    find_library(BITPUSH_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} NO_DEFAULT_PATH)
    if(BITPUSH_NCCL_INCLUDE AND BITPUSH_NCCL_LIBRARY)
      set(BITPUSH_HAVE_NCCL 1)
    endif()
    message(STATUS "bitpush: CUDA ${CUDAToolkit_VERSION} at ${CUDAToolkit_BIN_DIR}")
  elseif(_bp_cuda STREQUAL "ON")
    message(FATAL_ERROR "BITPUSH_WITH_CUDA=ON but no CUDA toolkit was found at "
                        "BITPUSH_CUDA_ROOT='${BITPUSH_CUDA_ROOT}' (no bin/nvcc there). "
                        "Install CUDA, point -DBITPUSH_CUDA_ROOT at it, or configure with "
                        "-DBITPUSH_WITH_CUDA=AUTO or OFF.")
  else()
    message(STATUS "bitpush: no CUDA toolkit at '${BITPUSH_CUDA_ROOT}': building without CUDA")
  endif()
endif()

# bitpush_enable_cuda_here(): called from a directory with .cu sources (worker/gpu,
# optimizers) when BITPUSH_HAVE_CUDA: enables the CUDA language in that directory only (a
# CPU-only configuration never looks for nvcc), with SASS for A100 (sm_80) and H100/H200
# (sm_90) plus compute_90 PTX that newer GPUs JIT — a short list keeps nvcc time small (CI
# builds on 2 cores; override with -DCMAKE_CUDA_ARCHITECTURES=...). The project-wide
# warning/sanitizer flags are host-compiler flags nvcc rejects: they are kept for the
# directory's C/C++ sources only.
macro(bitpush_enable_cuda_here)
  if(NOT DEFINED CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}")
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80-real 90)
  endif()
  enable_language(CUDA)
  get_directory_property(_bp_opts COMPILE_OPTIONS)
  set(_bp_host_opts "")
  foreach(_opt IN LISTS _bp_opts)
    list(APPEND _bp_host_opts "$<$<COMPILE_LANGUAGE:C,CXX>:${_opt}>")
  endforeach()
  set_directory_properties(PROPERTIES COMPILE_OPTIONS "${_bp_host_opts}")
endmacro()
