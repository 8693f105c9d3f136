// A C++ program embedding a deploytool model: load it, fill its inputs, run it, read its outputs.
// Names, shapes and dtypes come from the .so's own metadata (deploytool_model.h).
//
//   ./example model.so
#include <cstdio>
#include <iostream>

#include "deploytool_model.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s model.so\n", argv[0]);
    return 2;
  }
  try {
    deploytool::Model model(argv[1]);  // refuses a .so for another runtime, architecture or CPU
    std::vector<tvm::ffi::Tensor> inputs;
    for (const auto& spec : model.inputs()) {
      tvm::ffi::Tensor t = deploytool::Model::Empty(spec);
      size_t n = spec.bytes() / ((spec.dl_dtype().bits + 7) / 8);
      // A deterministic pattern: element i holds (i % 17) / 17 (or i % 17 for integer inputs).
      for (size_t i = 0; i < n; ++i) {
        double v = spec.dtype.rfind("float", 0) == 0 ? (i % 17) / 17.0 : static_cast<double>(i % 17);
        if (spec.dtype == "float32") static_cast<float*>(t.data_ptr())[i] = static_cast<float>(v);
        else if (spec.dtype == "float64") static_cast<double*>(t.data_ptr())[i] = v;
        else if (spec.dtype == "int64") static_cast<int64_t*>(t.data_ptr())[i] = static_cast<int64_t>(v);
        else if (spec.dtype == "int32") static_cast<int32_t*>(t.data_ptr())[i] = static_cast<int32_t>(v);
        else throw deploytool::Error("this example fills float32/float64/int32/int64 inputs, not " + spec.dtype);
      }
      std::printf("input  %s: %s, %zu elements\n", spec.name.c_str(), spec.dtype.c_str(), n);
      inputs.push_back(t);
    }
    std::vector<tvm::ffi::Tensor> outputs = model.Run(inputs);
    for (size_t k = 0; k < outputs.size(); ++k) {
      const auto& spec = model.outputs()[k];
      if (spec.dtype != "float32") {
        std::printf("output %s: %s\n", spec.name.c_str(), spec.dtype.c_str());
        continue;
      }
      const float* y = static_cast<const float*>(outputs[k].data_ptr());
      size_t n = spec.bytes() / 4;
      double sum = 0;
      for (size_t i = 0; i < n; ++i) sum += y[i];
      std::printf("output %s: float32, %zu elements, sum %.9g, first %.9g\n", spec.name.c_str(), n, sum, y[0]);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
