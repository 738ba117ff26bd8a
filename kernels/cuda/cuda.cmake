# kernels/cuda/cuda.cmake: the CUDA backend library (dl_kernels_cuda) and its
# CPU-vs-CUDA parity test. Included by kernels/CMakeLists.txt when DLOCO_HAVE_CUDA.
set(DL_CUDA_DIR ${CMAKE_CURRENT_LIST_DIR})

add_library(dl_kernels_cuda STATIC
  ${DL_CUDA_DIR}/cuda.cu
  ${DL_CUDA_DIR}/optim.cu
  ${DL_CUDA_DIR}/matmul.cu
  ${DL_CUDA_DIR}/layer.cu
  ${DL_CUDA_DIR}/attention.cu
  ${DL_CUDA_DIR}/xent.cu
  ${DL_CUDA_DIR}/codec.cu)
# The codecs decode bit-exactly like the CPU (kernels/codec.h): never fuse a
# multiply and an add, whatever the intrinsics leave to the compiler.
set_source_files_properties(${DL_CUDA_DIR}/codec.cu PROPERTIES COMPILE_OPTIONS -fmad=false)
set_target_properties(dl_kernels_cuda PROPERTIES
  CUDA_STANDARD 17
  CUDA_STANDARD_REQUIRED ON
  POSITION_INDEPENDENT_CODE ON)
# Warnings are errors for nvcc itself (device code, ptxas) and for the host
# compiler on the host half of each .cu file. -UNDEBUG: like the C code, keep
# assert() (API misuse) in release builds.
target_compile_options(dl_kernels_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror -UNDEBUG>)
target_link_libraries(dl_kernels_cuda PUBLIC dl_core CUDA::cudart CUDA::cublas)
# codec.cu shares the CPU codec's argument checks and messages (kernels/codec.c).
target_link_libraries(dl_kernels_cuda PUBLIC dl_kernels)

# The top level adds -fsanitize=... to every language when DLOCO_SANITIZE;
# nvcc rejects those flags, so keep them off the .cu files (the host wrappers
# stay unsanitized, the C callers and the link are still sanitized).
get_target_property(_dl_cuda_opts dl_kernels_cuda COMPILE_OPTIONS)
if(_dl_cuda_opts)
  list(FILTER _dl_cuda_opts EXCLUDE REGEX "^-f(sanitize|no-sanitize|no-omit-frame-pointer)")
  set_property(TARGET dl_kernels_cuda PROPERTY COMPILE_OPTIONS ${_dl_cuda_opts})
endif()

# Parity test: exits 77 (reported as Skipped, the reason after ctest's summary) when no device is usable.
dl_add_test(test_cuda_kernels SKIPPABLE
  SOURCES ${PROJECT_SOURCE_DIR}/tests/test_cuda_kernels.c
  LIBS dl_kernels_cuda dl_kernels
  TIMEOUT 120
  LABELS gpu)
# Codec parity: the CPU's bytes and floats for every codec; same skip.
dl_add_test(test_cuda_codec SKIPPABLE
  SOURCES ${PROJECT_SOURCE_DIR}/tests/test_cuda_codec.c
  LIBS dl_kernels_cuda dl_kernels
  TIMEOUT 120
  LABELS gpu)
if(DLOCO_SANITIZE)
  # CUDA maps device-visible memory inside ASan's shadow gap.
  set_property(TEST test_cuda_kernels APPEND PROPERTY ENVIRONMENT "ASAN_OPTIONS=protect_shadow_gap=0")
  set_property(TEST test_cuda_codec APPEND PROPERTY ENVIRONMENT "ASAN_OPTIONS=protect_shadow_gap=0")
endif()
