// D08 32-bit index overflow: relu with an `int` index. blockIdx.x * blockDim.x is computed in 32
// bits, so past 2^31 elements the index goes negative and the kernel writes before the tensor.
// Observable only above 2^31 elements (46341 x 46341 = 2147488281); the static lint catches it.
extern "C" __global__ void kc_relu_int32(float* __restrict__ out, const float* __restrict__ x, long long n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const float v = x[i];
    out[i] = (v > 0.0f || v != v) ? v : 0.0f;
  }
}
