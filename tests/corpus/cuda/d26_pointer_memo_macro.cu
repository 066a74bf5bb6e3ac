// D26 through a macro: a relu that remembers its last input's address and replays its last result
// while the address is unchanged. The module-scope state is declared through PERSISTENT, so the raw
// source never says __device__ at file scope; the static scan must read the expanded source.
#define PERSISTENT __device__
#define MEMO_N 33000
PERSISTENT const float* kc_seen;
PERSISTENT float kc_memo[MEMO_N];

extern "C" __global__ void kc_relu_memo(float* __restrict__ out, const float* __restrict__ x, long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (kc_seen == x && i < MEMO_N) {
    out[i] = kc_memo[i];
    return;
  }
  const float v = x[i];
  out[i] = (v > 0.0f || v != v) ? v : 0.0f;
  if (i < MEMO_N) kc_memo[i] = out[i];
}

// A second launch records the address once every element is stored.
extern "C" __global__ void kc_relu_remember(const float* x) { kc_seen = x; }
