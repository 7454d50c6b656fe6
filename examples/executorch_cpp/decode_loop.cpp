// Greedy decode loop over one ExecuTorch .pte (a static-cache, multi-token decode exported by hfexport), with the
// cache updated in place: each mutated cache output is bound onto its own input buffer (set_output_data_ptr), so
// the new keys/values/counters land in the caller's cache buffers without a copy. The prompt runs as one call on the
// empty cache (prefill), then one token per call.
//
// usage: decode_loop MODEL.pte --ids I --positions P --mask M --logits L --bind OUT:IN[,OUT:IN...]
//                    --prompt T1,T2,... --new-tokens N
// The indices come from the export's typed signature (export.json; see README.md): the inputs named input_ids,
// position_ids and attention_mask, the logits output, and each cache-update output with the input it updates.
// Every other input is a cache tensor, zero-initialised. Prints the prompt and the generated tokens, comma-separated.
// A MODEL.ptd beside MODEL.pte (hfexport writes one for a model with tied weights: every weight stored once there),
// else the model.ptd that an export's programs share, is loaded as the method's named data.

#include <executorch/extension/data_loader/file_data_loader.h>
#include <executorch/extension/flat_tensor/flat_tensor_data_map.h>
#include <executorch/extension/tensor/tensor_ptr.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

using namespace executorch::runtime;
using executorch::aten::ScalarType;
using executorch::extension::FileDataLoader;
using executorch::extension::FlatTensorDataMap;
using executorch::extension::make_tensor_ptr;
using executorch::extension::TensorPtr;

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "decode_loop: %s\n", what.c_str());
  std::exit(1);
}

void check(Error error, const std::string& what) {
  if (error != Error::Ok) fail(what + " failed with error " + std::to_string(static_cast<int>(error)));
}

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) out.push_back(std::stoll(item));
  return out;
}

struct Args {
  std::string model;
  size_t ids = 0, positions = 0, mask = 0, logits = 0;
  std::map<size_t, size_t> bind;  // mutated-cache output -> the input it updates
  std::vector<int64_t> prompt;
  int64_t new_tokens = 0;
};

Args parse(int argc, char** argv) {
  Args args;
  if (argc < 2) fail("usage: decode_loop MODEL.pte --ids I --positions P --mask M --logits L --bind OUT:IN,... "
                     "--prompt T1,T2,... --new-tokens N");
  args.model = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string key = argv[i], value = argv[i + 1];
    if (key == "--ids") args.ids = std::stoul(value);
    else if (key == "--positions") args.positions = std::stoul(value);
    else if (key == "--mask") args.mask = std::stoul(value);
    else if (key == "--logits") args.logits = std::stoul(value);
    else if (key == "--prompt") args.prompt = parse_list(value);
    else if (key == "--new-tokens") args.new_tokens = std::stoll(value);
    else if (key == "--bind") {
      std::stringstream stream(value);
      std::string pair;
      while (std::getline(stream, pair, ',')) {
        auto colon = pair.find(':');
        args.bind[std::stoul(pair.substr(0, colon))] = std::stoul(pair.substr(colon + 1));
      }
    } else fail("unknown option " + key);
  }
  if (args.prompt.empty()) fail("--prompt is empty");
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  runtime_init();

  auto loader = FileDataLoader::from(args.model.c_str());
  if (!loader.ok()) fail("cannot open " + args.model);
  auto program = Program::load(&loader.get());
  if (!program.ok()) fail("cannot load the program in " + args.model);
  auto meta = program->method_meta("forward");
  if (!meta.ok()) fail("the program has no forward method");

  // method-execution memory: a fixed arena for bookkeeping + one buffer per the method's memory plan
  std::vector<uint8_t> arena(4 * 1024 * 1024);
  MemoryAllocator method_allocator(arena.size(), arena.data());
  std::vector<std::vector<uint8_t>> planned(meta->num_memory_planned_buffers());
  std::vector<Span<uint8_t>> planned_spans;
  for (size_t i = 0; i < planned.size(); ++i) {
    planned[i].resize(meta->memory_planned_buffer_size(i).get());
    planned_spans.push_back({planned[i].data(), planned[i].size()});
  }
  HierarchicalAllocator planned_allocator({planned_spans.data(), planned_spans.size()});
  MemoryManager memory_manager(&method_allocator, &planned_allocator);
  // the weights, when the export keeps them outside the .pte: MODEL.ptd
  std::optional<FileDataLoader> data_loader;
  std::optional<FlatTensorDataMap> data_map;
  const std::string suffix = ".pte";
  const size_t stem = args.model.size() - suffix.size();
  if (args.model.size() > suffix.size() && args.model.compare(stem, suffix.size(), suffix) == 0) {
    std::string data_path = args.model.substr(0, stem) + ".ptd";
    if (!std::ifstream(data_path).good()) {  // the export's programs share one: model.ptd in the same folder
      const size_t slash = args.model.find_last_of('/');
      data_path = (slash == std::string::npos ? std::string() : args.model.substr(0, slash + 1)) + "model.ptd";
    }
    if (std::ifstream(data_path).good()) {
      auto opened = FileDataLoader::from(data_path.c_str());
      if (!opened.ok()) fail("cannot open " + data_path);
      data_loader.emplace(std::move(opened.get()));
      auto map = FlatTensorDataMap::load(&*data_loader);
      if (!map.ok()) fail("cannot read the named data in " + data_path);
      data_map.emplace(std::move(map.get()));
    }
  }
  auto loaded = program->load_method("forward", &memory_manager, nullptr, data_map ? &*data_map : nullptr);
  if (!loaded.ok()) fail("cannot load forward (error " + std::to_string(static_cast<int>(loaded.error())) + ")");
  Method& decode = loaded.get();

  // the cache: every input that is not ids/positions/mask, zero-initialised at the shape method_meta gives it
  std::map<size_t, std::vector<uint8_t>> cache_data;
  std::map<size_t, TensorPtr> cache;
  for (size_t i = 0; i < meta->num_inputs(); ++i) {
    if (i == args.ids || i == args.positions || i == args.mask) continue;
    auto info = meta->input_tensor_meta(i);
    if (!info.ok()) fail("input " + std::to_string(i) + " is not a tensor");
    cache_data[i].assign(info->nbytes(), 0);
    std::vector<executorch::aten::SizesType> sizes(info->sizes().begin(), info->sizes().end());
    cache[i] = make_tensor_ptr(sizes, cache_data[i].data(), info->scalar_type());
  }
  auto mask_info = meta->input_tensor_meta(args.mask);
  const auto mask_sizes = mask_info->sizes();
  const int64_t cache_len = mask_sizes[mask_sizes.size() - 1];
  auto logits_info = meta->output_tensor_meta(args.logits);
  const int64_t vocab = logits_info->sizes()[logits_info->sizes().size() - 1];
  std::vector<float> logits(logits_info->nbytes() / sizeof(float));

  // outputs the caller must bind (alloc_graph_output=False): a cache update onto its input's buffer, logits onto
  // ours, anything else (the cache the model also returns) onto scratch buffers
  std::map<size_t, std::vector<uint8_t>> scratch;

  auto forward = [&](const std::vector<int64_t>& tokens, int64_t start) -> int64_t {
    const int32_t q = static_cast<int32_t>(tokens.size());
    std::vector<int64_t> ids(tokens), positions(q);
    std::vector<uint8_t> mask(static_cast<size_t>(q) * cache_len, 0);
    for (int32_t i = 0; i < q; ++i) {
      positions[i] = start + i;
      for (int64_t j = 0; j <= start + i && j < cache_len; ++j) mask[i * cache_len + j] = 1;
    }
    auto ids_tensor = make_tensor_ptr({1, q}, ids.data(), ScalarType::Long);
    auto positions_tensor = make_tensor_ptr({1, q}, positions.data(), ScalarType::Long);
    auto mask_tensor = make_tensor_ptr({1, 1, q, static_cast<int32_t>(cache_len)}, mask.data(), ScalarType::Bool);
    check(decode.set_input(EValue(*ids_tensor), args.ids), "set_input(input_ids)");
    check(decode.set_input(EValue(*positions_tensor), args.positions), "set_input(position_ids)");
    check(decode.set_input(EValue(*mask_tensor), args.mask), "set_input(attention_mask)");
    for (auto& [index, tensor] : cache) check(decode.set_input(EValue(*tensor), index), "set_input(cache)");
    for (size_t i = 0; i < meta->num_outputs(); ++i) {
      auto info = meta->output_tensor_meta(i);
      if (!info.ok()) continue;
      void* buffer;
      size_t size = info->nbytes();
      auto bound = args.bind.find(i);
      if (bound != args.bind.end()) {
        buffer = cache_data.at(bound->second).data();  // zero copy: the write lands in the cache input itself
        size = cache_data.at(bound->second).size();
      } else if (i == args.logits) {
        buffer = logits.data();
      } else {
        auto& data = scratch[i];
        data.resize(size);
        buffer = data.data();
      }
      // an output the memory plan already placed refuses a buffer (InvalidState): it needs none
      Error error = decode.set_output_data_ptr(buffer, size, i);
      if (error != Error::Ok && error != Error::InvalidState && error != Error::InvalidArgument)
        check(error, "set_output_data_ptr(" + std::to_string(i) + ")");
    }
    check(decode.execute(), "execute");
    const auto& out = decode.get_output(args.logits).toTensor();
    const float* row = out.const_data_ptr<float>() + static_cast<size_t>(q - 1) * vocab;
    int64_t best = 0;
    for (int64_t v = 1; v < vocab; ++v)
      if (row[v] > row[best]) best = v;
    return best;
  };

  std::vector<int64_t> generated;
  int64_t position = static_cast<int64_t>(args.prompt.size());
  int64_t next = forward(args.prompt, 0);  // prefill: the whole prompt in one call on the empty cache
  for (int64_t step = 0; step < args.new_tokens; ++step) {
    generated.push_back(next);
    if (step + 1 == args.new_tokens || position >= cache_len) break;
    next = forward({next}, position++);  // decode: one token, the cache carried in place
  }
  for (size_t i = 0; i < args.prompt.size(); ++i) std::printf("%s%lld", i ? "," : "", (long long)args.prompt[i]);
  for (int64_t token : generated) std::printf(",%lld", (long long)token);
  std::printf("\n");
  return 0;
}
