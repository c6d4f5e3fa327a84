// Relocatable device code (-rdc): a device function defined in one unit and
// called from another, so nvcc must keep __nv_relfatbin and device-link.
__device__ float rdc_helper(float v) { return v * v + 1.0f; }
