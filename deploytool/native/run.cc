// run: the bundle's native runner. Runs a deploytool .so with the TVM runtime alone.
//
//   ./run model.so --inputs in0.npy [in1.npy ...] [--outdir DIR] [--repeat N]
//   ./run model.so --describe
//
// Inputs are .npy files in the order of the model's inputs (see --describe); each output is written
// to DIR/<name>.npy (default: the current folder), names made file-safe. --repeat N also times N runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "deploytool_model.h"
#include "npy.h"

static std::string FileSafe(std::string s) {
  for (char& c : s)
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) c = '_';
  return s;
}

static std::string Shape(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") {
    std::cerr << "usage: " << argv[0] << " model.so --inputs in0.npy [in1.npy ...] [--outdir DIR] [--repeat N]\n"
              << "       " << argv[0] << " model.so --describe\n";
    return 2;
  }
  std::string model_path = argv[1], outdir = ".";
  std::vector<std::string> input_files;
  int repeat = 0;
  bool describe = false;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--inputs") {
      while (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) input_files.push_back(argv[++i]);
    } else if (a == "--outdir" && i + 1 < argc) {
      outdir = argv[++i];
    } else if (a == "--repeat" && i + 1 < argc) {
      repeat = std::stoi(argv[++i]);
    } else if (a == "--describe") {
      describe = true;
    } else {
      std::cerr << "run: error: unknown argument '" << a << "': see --help\n";
      return 2;
    }
  }
  try {
    deploytool::Model model(model_path);
    if (describe) {
      for (auto& s : model.inputs()) std::cout << "input  " << s.name << ": " << s.dtype << Shape(s.shape) << "\n";
      for (auto& s : model.outputs()) std::cout << "output " << s.name << ": " << s.dtype << Shape(s.shape) << "\n";
      return 0;
    }
    if (input_files.size() != model.inputs().size()) {
      std::cerr << "run: error: the model takes " << model.inputs().size() << " input(s), got " << input_files.size()
                << ": pass one .npy per input, in order (see --describe)\n";
      return 2;
    }
    std::vector<tvm::ffi::Tensor> args;
    for (size_t i = 0; i < input_files.size(); ++i) {
      const auto& spec = model.inputs()[i];
      npy::Array a = npy::Load(input_files[i]);
      if (a.dtype != spec.dtype || a.shape != spec.shape) {
        std::cerr << "run: error: input " << spec.name << " is " << a.dtype << Shape(a.shape) << " in '"
                  << input_files[i] << "', the model wants " << spec.dtype << Shape(spec.shape)
                  << ": convert the array\n";
        return 2;
      }
      tvm::ffi::Tensor t = deploytool::Model::Empty(spec);
      std::memcpy(t.data_ptr(), a.data.data(), a.data.size());
      args.push_back(t);
    }
    std::vector<tvm::ffi::Tensor> outs = model.Run(args);
    if (repeat > 0) {
      std::vector<double> ms;
      for (int r = 0; r < repeat; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        model.Run(args);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(ms.begin(), ms.end());
      std::printf("latency over %d runs: min %.3f ms, median %.3f ms\n", repeat, ms.front(), ms[ms.size() / 2]);
    }
    for (size_t i = 0; i < outs.size() && i < model.outputs().size(); ++i) {
      const auto& spec = model.outputs()[i];
      std::string path = outdir + "/" + FileSafe(spec.name) + ".npy";
      const DLTensor* t = outs[i].GetDLTensorPtr();
      std::vector<int64_t> shape(t->shape, t->shape + t->ndim);
      npy::Save(path, spec.dtype, shape, t->data, tvm::ffi::GetDataSize(*t));
      std::cout << spec.name << ": " << spec.dtype << Shape(shape) << " -> " << path << "\n";
    }
  } catch (const deploytool::Error& e) {
    std::cerr << "run: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "run: error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
