# BITPUSH_WITH_CUDA = AUTO | ON | OFF
#   AUTO: use CUDA if a toolkit is found (default location /usr/local/cuda).
#   ON:   CUDA is required; a missing toolkit is a configure error.
#   OFF:  never use CUDA.
# Sets BITPUSH_HAVE_CUDA / BITPUSH_HAVE_NCCL (0/1) for the generated config header.
set(BITPUSH_WITH_CUDA "AUTO" CACHE STRING "Build CUDA/NCCL code: AUTO, ON or OFF")
set_property(CACHE BITPUSH_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${BITPUSH_WITH_CUDA}" _bp_cuda)
if(NOT _bp_cuda MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "BITPUSH_WITH_CUDA must be AUTO, ON or OFF (got '${BITPUSH_WITH_CUDA}')")
endif()

set(BITPUSH_HAVE_CUDA 0)
set(BITPUSH_HAVE_NCCL 0)
if(NOT _bp_cuda STREQUAL "OFF")
  if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(BITPUSH_HAVE_CUDA 1)
    find_path(BITPUSH_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(BITPUSH_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
    if(BITPUSH_NCCL_INCLUDE AND BITPUSH_NCCL_LIBRARY)
      set(BITPUSH_HAVE_NCCL 1)
    endif()
    message(STATUS "bitpush: CUDA ${CUDAToolkit_VERSION} at ${CUDAToolkit_BIN_DIR}")
  elseif(_bp_cuda STREQUAL "ON")
    message(FATAL_ERROR "BITPUSH_WITH_CUDA=ON but no CUDA toolkit was found "
                        "(looked in CUDAToolkit_ROOT='${CUDAToolkit_ROOT}' and the PATH). "
                        "Install CUDA or configure with -DBITPUSH_WITH_CUDA=OFF/AUTO.")
  endif()
endif()
