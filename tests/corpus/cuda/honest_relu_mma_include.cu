// Honest: a plain fp32 relu that includes <mma.h> and uses nothing from it. Naming a header is not
// a defect; only using tensor-core math under the fp32 policy is (the include rule judges use).
#include <mma.h>

extern "C" __global__ void kc_relu_f32(float* __restrict__ out, const float* __restrict__ x, long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const float v = x[i];
    out[i] = (v > 0.0f || v != v) ? v : 0.0f;
  }
}
