// nvml-mocks: NVIDIA's NVML mock servers (go-nvml) described as JSON, for tests/nvml_mocks.rs.
module gpu-dra/e2e/nvml-mocks

go 1.26.0

require github.com/NVIDIA/go-nvml v0.13.4-1

require github.com/google/uuid v1.6.0 // indirect
