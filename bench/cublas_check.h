// CHECK_CUBLAS(expr): exits with file:line and the status when a cuBLAS or
// cuBLASLt call fails (the benchmarks' baselines and rooflines).
#pragma once

#include <cublas_api.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUBLAS(expr)                                                             \
  do {                                                                                 \
    cublasStatus_t _s = (expr);                                                        \
    if (_s != CUBLAS_STATUS_SUCCESS) {                                                 \
      std::fprintf(stderr, "%s:%d: %s: cublas status %d\n", __FILE__, __LINE__, #expr, \
                   static_cast<int>(_s));                                              \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)
