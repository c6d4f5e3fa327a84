__device__ float rdc_helper(float v);

extern "C" __global__ void rdc_kernel(float* data, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] = rdc_helper(data[i]);
}

extern "C" int fixture_rdc_launch(float* data, int n) {
  rdc_kernel<<<(n + 255) / 256, 256>>>(data, n);
  return 0;
}
