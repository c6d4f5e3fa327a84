// A small CUDA library for the test "vLLM" wheel: one kernel, compiled by the
// real nvcc for the architecture the test asks for, so the cubin gate has
// genuine GPU code to accept (sm_121a / sm_120f) or refuse (sm_90).
extern "C" __global__ void spark_scale(float* out, const float* in, float k, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * k;
}

extern "C" int spark_launch(float* out, const float* in, float k, int n) {
  spark_scale<<<(n + 127) / 128, 128>>>(out, in, k, n);
  return 0;
}
