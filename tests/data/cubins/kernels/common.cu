// Fixture kernels for the cubin inspector tests: small, but real device code
// so that every fatbin entry holds named kernels.
extern "C" __global__ void saxpy_kernel(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

template <typename T>
__global__ void scale_kernel(T* data, T factor, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] *= factor;
}

template __global__ void scale_kernel<float>(float*, float, int);
template __global__ void scale_kernel<double>(double*, double, int);

extern "C" int fixture_common_launch(float* x, float* y, int n) {
  saxpy_kernel<<<(n + 255) / 256, 256>>>(n, 2.0f, x, y);
  return 0;
}
