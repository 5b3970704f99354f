#include "client/cli/moe_commands.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/float16.h"
#include "base/status.h"
#include "client/cli/args.h"
#include "client/cli/common.h"
#include "client/cli/format.h"
#include "client/cpp/client.h"
#include "client/cpp/shm_region.h"
#include "base/float16.h"
#include "base/status.h"
#include "resolve/oracle/moe_config.h"
#include "resolve/proto/moe_plan_convert.h"

namespace kplan::cli {
namespace {

constexpr int64_t kChunkBytes = 4 << 20;

// --flag VALUE as an integer >= `min`; an empty value keeps `*out`.
absl::Status ParseInt(absl::string_view flag, const std::string& value, int64_t min, int64_t* out) {
  if (value.empty()) return absl::OkStatus();
  int64_t v = 0;
  if (!absl::SimpleAtoi(value, &v) || v < min) {
    return InvalidField(
        flag, absl::StrCat("--", flag, " needs an integer >= ", min, ", got '", value, "'"));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status Required(absl::string_view flag, const std::string& value) {
  if (value.empty()) return InvalidField(flag, absl::StrCat("--", flag, " is required"));
  return absl::OkStatus();
}

// A plain floating-point dtype name: its proto value and element type.
struct PlainDType {
  v1::DType proto;
  int64_t size;
};
absl::StatusOr<PlainDType> ParsePlainDType(absl::string_view flag, const std::string& name) {
  if (name == "float32") return PlainDType{v1::DTYPE_FLOAT32, 4};
  if (name == "float16") return PlainDType{v1::DTYPE_FLOAT16, 2};
  if (name == "bfloat16") return PlainDType{v1::DTYPE_BFLOAT16, 2};
  return InvalidField(
      flag, absl::StrCat("--", flag, " takes float32, float16 or bfloat16, got '", name, "'"));
}

// `count` random values of `dtype` into `out`, uniform in +-[0.1, 1) * scale
// (never zero); a run of calls draws what one call for the whole would.
void FillRandom(char* out, int64_t count, const PlainDType& dtype, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> magnitude(0.1f, 1.0f);
  std::bernoulli_distribution negative(0.5);
  for (int64_t i = 0; i < count; ++i) {
    const float v = magnitude(rng) * scale;
    const float x = negative(rng) ? -v : v;
    if (dtype.proto == v1::DTYPE_FLOAT32) {
      std::memcpy(out + i * 4, &x, 4);
    } else {
      const uint16_t h = dtype.proto == v1::DTYPE_FLOAT16 ? FloatToHalf(x) : FloatToBf16(x);
      std::memcpy(out + i * 2, &h, 2);
    }
  }
}

std::string RandomValues(int64_t count, const PlainDType& dtype, float scale, std::mt19937& rng) {
  std::string data(count * dtype.size, '\0');
  FillRandom(data.data(), count, dtype, scale, rng);
  return data;
}

v1::Tensor RandomTensor(std::vector<int64_t> shape, const PlainDType& dtype, float scale,
                        std::mt19937& rng) {
  v1::Tensor t;
  t.set_dtype(dtype.proto);
  int64_t count = 1;
  for (int64_t d : shape) {
    t.add_shape(d);
    count *= d;
  }
  t.set_data(RandomValues(count, dtype, scale, rng));
  return t;
}

// The random weights of --random, generated chunk by chunk as the load
// streams them (w13, then w2, each scaled by 1/sqrt(fan-in)): the same
// values for a seed as generating each tensor whole.
std::unique_ptr<ChunkSource> RandomWeights(int64_t e, int64_t rows, int64_t h, int64_t i,
                                           const PlainDType& dtype, uint32_t seed) {
  auto rng = std::make_shared<std::mt19937>(seed);
  auto tensor = [&](const char* name, std::vector<int64_t> shape, float scale) {
    StreamedTensor t;
    t.name = name;
    t.dtype = dtype.proto;
    t.bytes = dtype.size;
    for (int64_t d : shape) t.bytes *= d;
    t.shape = std::move(shape);
    t.read = [rng, dtype, scale](int64_t, int64_t n, char* out) {
      FillRandom(out, n / dtype.size, dtype, scale, *rng);
      return absl::OkStatus();
    };
    return t;
  };
  std::vector<StreamedTensor> tensors;
  tensors.push_back(tensor("w13", {e, rows, h}, 1.0f / std::sqrt(float(h))));
  tensors.push_back(tensor("w2", {e, h, i}, 1.0f / std::sqrt(float(i))));
  return std::make_unique<TensorChunkSource>(std::move(tensors), kChunkBytes, [rng, seed] {
    rng->seed(seed);
    return absl::OkStatus();
  });
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// A load's progress as the server reports it (ListExperts, through
// LoadWatch): a bar redrawn in place on a terminal, a line per tenth
// otherwise (a log, a pipe). On stderr, so --json output stays clean.
class ProgressBar {
 public:
  // Called from the watcher's thread while the load runs, then once from
  // the caller's with the final state.
  void Show(int64_t done, int64_t total, int experts_done, int experts_total, bool last) {
    std::lock_guard<std::mutex> lock(mu_);
    if (total <= 0) return;
    const std::string of = absl::StrCat(Bytes(done), " of ", Bytes(total));
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start_);
    const int percent = static_cast<int>(100 * std::min<int64_t>(done, total) / total);
    if (terminal_) {
      const int filled = percent * 30 / 100;
      std::fprintf(stderr, "\r\033[Kloading [%s%s] %3d%% %s, %.0f MB/s, %d/%d experts%s",
                   std::string(filled, '#').c_str(), std::string(30 - filled, '.').c_str(), percent,
                   of.c_str(), seconds > 0 ? done / seconds / 1e6 : 0.0, experts_done,
                   experts_total, last ? "\n" : "");
      drawn_ = !last;
      return;
    }
    const int tenths = percent / 10;
    if (tenths <= tenths_) return;
    tenths_ = tenths;
    std::fprintf(stderr, "loading: %d%% (%s, %d of %d experts) in %.1f s\n", percent, of.c_str(),
                 experts_done, experts_total, seconds);
  }
  // The load failed: ends a bar drawn in place, so the error gets its own line.
  void Abandon() {
    std::lock_guard<std::mutex> lock(mu_);
    if (drawn_) std::fputc('\n', stderr);
    drawn_ = false;
  }

 private:
  std::mutex mu_;
  int tenths_ = 0;
  bool drawn_ = false;
  const bool terminal_ = isatty(STDERR_FILENO) != 0;
  const absl::Time start_ = absl::Now();
};

// The bytes a plain set of this header streams: w13 [E, 2I or I, H], w2 [E, H, I].
int64_t PlainSetBytes(const v1::ExpertsHeader& h, int64_t dtype_bytes) {
  absl::StatusOr<MoEActivation> act = MoEActivationFromStr(h.activation());
  const int64_t rows =
      act.ok() && IsGated(*act) ? 2 * h.intermediate_size() : h.intermediate_size();
  return int64_t{h.num_experts()} *
         (rows * h.hidden_size() + h.hidden_size() * h.intermediate_size()) * dtype_bytes;
}

}  // namespace

int ExpertsCommand(const std::vector<std::string>& args) {
  ArgParser parser;
  CommonFlags common;
  common.Register(parser);
  const std::string synopsis =
      "usage: kplan experts [options]\n\nList the expert sets on the server: their state (ready, "
      "or "
      "how far a load under way has come), shapes, dtype, activation, bytes, placement and, on an "
      "expert-parallel group, each rank's shard.";
  if (auto exit = ParseOrExit(parser, args, synopsis)) return *exit;
  absl::StatusOr<std::unique_ptr<Client>> client = common.Connect();
  if (!client.ok()) return Fail(client.status());
  absl::StatusOr<v1::ListExpertsResponse> list = (*client)->ListExperts();
  if (!list.ok()) return Fail(list.status());
  std::cout << (common.json ? ToJson(*list) : FormatExperts(list->experts()));
  return 0;
}

void LoadFlags::Register(ArgParser& p) {
  p.AddString("id", "ID", "experts_id of the new set (required)", &id);
  p.AddString("num-experts", "E", "number of experts (required)", &num_experts);
  p.AddString("hidden-size,hidden", "H", "hidden size (required)", &hidden_size);
  p.AddString("intermediate-size,intermediate", "I", "intermediate size per expert (required)",
              &intermediate_size);
  p.AddString("dtype", "DTYPE", "weight dtype: bfloat16, float16, float32", &dtype);
  p.AddString("activation", "NAME", "MoEActivation value: silu, gelu, swigluoai, silu_no_mul, ...",
              &activation);
  p.AddString("quantization", "SCHEME",
              "quantisation scheme of the weights (fp8_per_tensor, fp8_block, int8_group, ...); "
              "the server loads quantised sets only inline, so neither source here takes one",
              &quantization);
  p.AddString("safetensors", "PATH",
              "safetensors file (or sharded checkpoint's model.safetensors.index.json) on the "
              "server host, under its --model_root",
              &safetensors);
  p.AddString("template", "NAME",
              "per-expert tensor names with {e} for the expert and {proj} for gate_proj, "
              "up_proj and down_proj, e.g. 'model.layers.0.mlp.experts.{e}.{proj}.weight'",
              &name_template);
  p.AddString("gate-proj", "NAME", "per-expert [I, H] name with {e} (overrides --template)",
              &gate_proj);
  p.AddString("up-proj", "NAME", "per-expert [I, H] name with {e} (overrides --template)",
              &up_proj);
  p.AddString("down-proj", "NAME", "per-expert [H, I] name with {e} (overrides --template)",
              &down_proj);
  p.AddString("w13", "NAME", "stacked [E, 2I, H] tensor name (with --w2)", &w13);
  p.AddString("w2", "NAME", "stacked [E, H, I] tensor name (with --w13)", &w2);
  p.AddSwitch("random", "generate and stream random weights of the given shape instead", &random);
  p.AddString("w13-file", "PATH",
              "stream [E, 2I, H] (gated; [E, I, H] otherwise) raw row-major --dtype weights "
              "from this file on the client host (with --w2-file)",
              &w13_file);
  p.AddString("w2-file", "PATH", "stream [E, H, I] raw weights from this client-side file",
              &w2_file);
  p.AddString("seed", "N", "seed of --random", &seed);
}

absl::Status LoadFlags::Build(v1::ExpertsHeader* header,
                              std::unique_ptr<ChunkSource>* source) const {
  KPLAN_RETURN_IF_ERROR(Required("id", id));
  int64_t e = 0, h = 0, i = 0, seed_value = 0;
  for (auto [flag, value, out] :
       {std::tuple("num-experts", &num_experts, &e), std::tuple("hidden-size", &hidden_size, &h),
        std::tuple("intermediate-size", &intermediate_size, &i)}) {
    KPLAN_RETURN_IF_ERROR(Required(flag, *value));
    KPLAN_RETURN_IF_ERROR(ParseInt(flag, *value, 1, out));
  }
  KPLAN_RETURN_IF_ERROR(ParseInt("seed", seed, 0, &seed_value));
  KPLAN_ASSIGN_OR_RETURN(PlainDType plain, ParsePlainDType("dtype", dtype));
  absl::StatusOr<MoEActivation> act = MoEActivationFromStr(activation);
  if (!act.ok()) return InvalidField("activation", act.status().message());
  header->set_experts_id(id);
  header->set_num_experts(e);
  header->set_hidden_size(h);
  header->set_intermediate_size(i);
  header->set_activation(activation);
  header->set_dtype(plain.proto);
  header->mutable_quantization()->set_scheme(quantization);
  const bool files = !w13_file.empty() || !w2_file.empty();
  if (int(random) + int(files) + int(!safetensors.empty()) != 1) {
    return InvalidField("safetensors",
                        "give one of --safetensors PATH, --random or --w13-file/--w2-file");
  }
  const int64_t rows = IsGated(*act) ? 2 * i : i;
  if ((random || files) && !quantization.empty()) {
    return InvalidField("quantization",
                        absl::StrCat(random ? "--random" : "--w13-file",
                                     " streams plain weights; drop --quantization"));
  }
  if (random) {
    *source = RandomWeights(e, rows, h, i, plain, static_cast<uint32_t>(seed_value));
    return absl::OkStatus();
  }
  if (files) {
    KPLAN_RETURN_IF_ERROR(Required("w13-file", w13_file));
    KPLAN_RETURN_IF_ERROR(Required("w2-file", w2_file));
    std::vector<StreamedTensor> tensors;
    KPLAN_ASSIGN_OR_RETURN(tensors.emplace_back(), RawFileTensor("w13", plain.proto, {e, rows, h},
                                                                 plain.size, w13_file, "w13-file"));
    KPLAN_ASSIGN_OR_RETURN(tensors.emplace_back(), RawFileTensor("w2", plain.proto, {e, h, i},
                                                                 plain.size, w2_file, "w2-file"));
    *source = std::make_unique<TensorChunkSource>(std::move(tensors), kChunkBytes);
    return absl::OkStatus();
  }
  v1::SafetensorsSource* st = header->mutable_safetensors();
  st->set_path(safetensors);
  st->set_w13(w13);
  st->set_w2(w2);
  if (!name_template.empty() && !absl::StrContains(name_template, "{proj}")) {
    return InvalidField("template",
                        "--template needs {proj} (and {e}); stacked tensors take "
                        "--w13 and --w2");
  }
  auto name = [&](const std::string& given, absl::string_view proj) {
    if (!given.empty() || name_template.empty()) return given;
    return absl::StrReplaceAll(name_template, {{"{proj}", proj}});
  };
  st->set_gate_proj(name(gate_proj, "gate_proj"));
  st->set_up_proj(name(up_proj, "up_proj"));
  st->set_down_proj(name(down_proj, "down_proj"));
  if (st->w13().empty() && st->w2().empty() && st->up_proj().empty()) {
    return InvalidField("template",
                        "name the tensors: --template, --gate-proj/--up-proj/"
                        "--down-proj or --w13/--w2");
  }
  return absl::OkStatus();
}

int LoadCommand(const std::vector<std::string>& args) {
  ArgParser parser;
  CommonFlags common;
  LoadFlags flags;
  common.timeout.clear();  // set from the set's size below, unless given
  common.timeout_help =
      "deadline of the load, retries included (default: 60 plus 1 per 100 MB of weights)";
  common.Register(parser);
  flags.Register(parser);
  const std::string synopsis =
      "usage: kplan load --id ID --num-experts E --hidden-size H --intermediate-size I\n"
      "           (--safetensors PATH (--template NAME | --w13 NAME --w2 NAME) | --random |\n"
      "            --w13-file PATH --w2-file PATH)\n"
      "\nLoad an expert set onto the server: from a safetensors file on the server host,\n"
      "under its --model_root (relative paths: under the first root; per-expert tensors named\n"
      "with {e}, or tensors stacked over experts; a model.safetensors.index.json for a sharded\n"
      "checkpoint), or weights streamed from here chunk by chunk: random ones (--random:\n"
      "values scaled by 1/sqrt(fan-in)) or raw row-major files on this host (--w13-file,\n"
      "--w2-file). Prints the set.\n"
      "Example: kplan load --id layer0 --random --num-experts 8 --hidden-size 256 "
      "--intermediate-size 512";
  if (auto exit = ParseOrExit(parser, args, synopsis)) return *exit;
  v1::ExpertsHeader header;
  std::unique_ptr<ChunkSource> source;
  if (absl::Status s = flags.Build(&header, &source); !s.ok()) return Fail(s);
  const int64_t bytes = PlainSetBytes(header, ParsePlainDType("dtype", flags.dtype)->size);
  if (!parser.Given("timeout")) {
    // A load's default deadline grows with its size: 60 s plus 1 s per
    // 100 MB (a server reading a file at 100 MB/s; the Python client's
    // load_timeout says the same); --timeout overrides it.
    common.timeout = absl::StrCat(60 + bytes / 100'000'000);
  }
  absl::StatusOr<std::unique_ptr<Client>> client = common.Connect();
  if (!client.ok()) return Fail(client.status());
  absl::StatusOr<v1::LoadExpertsResponse> loaded;
  ProgressBar bar;
  {
    // The server's view of the load, whatever its source (our stream or
    // a file the server reads).
    LoadWatch watch(**client, header.experts_id(), [&bar](const v1::ExpertsInfo& e) {
      bar.Show(e.progress().bytes_done(), e.progress().bytes_total(), e.progress().experts_done(),
               e.progress().experts_total(), false);
    });
    loaded = source != nullptr ? (*client)->LoadExperts(header, *source)
                               : (*client)->LoadExperts(header, std::vector<v1::TensorChunk>{});
  }
  if (!loaded.ok()) {
    bar.Abandon();
    return Fail(loaded.status());
  }
  bar.Show(loaded->experts().bytes(), loaded->experts().bytes(), loaded->experts().num_experts(),
           loaded->experts().num_experts(), true);
  if (common.json) {
    std::cout << ToJson(*loaded);
    return 0;
  }
  v1::ListExpertsResponse one;
  *one.add_experts() = loaded->experts();
  std::cout << FormatExperts(one.experts());
  return 0;
}

int UnloadCommand(const std::vector<std::string>& args) {
  ArgParser parser;
  CommonFlags common;
  common.Register(parser);
  std::string id;
  parser.AddString("id", "ID", "experts_id of the set (or as the one positional word)", &id,
                   /*positional=*/true);
  if (auto exit = ParseOrExit(parser, args,
                              "usage: kplan unload --id ID [options] (or kplan unload ID)\n\n"
                              "Unload the expert set ID.")) {
    return *exit;
  }
  if (absl::Status s = Required("id", id); !s.ok()) return Fail(s);
  absl::StatusOr<std::unique_ptr<Client>> client = common.Connect();
  if (!client.ok()) return Fail(client.status());
  absl::StatusOr<v1::UnloadExpertsResponse> freed = (*client)->UnloadExperts(id);
  if (!freed.ok()) return Fail(freed.status());
  if (common.json) {
    std::cout << ToJson(*freed);
  } else {
    std::cout << "unloaded " << id << " (" << freed->bytes_freed() << " bytes freed)\n";
  }
  return 0;
}

void RunMoeFlags::Register(ArgParser& p) {
  p.AddString("id", "ID", "experts_id of a resident set (required)", &id);
  p.AddString("tokens", "N", "tokens in the batch (required)", &tokens);
  p.AddString("top-k,experts-per-token", "K", "experts per token", &top_k);
  p.AddString("routing-method,routing", "METHOD",
              "RoutingMethodType: RenormalizeNaive, Default, Renormalize, Llama4, Sigmoid, "
              "SigmoidRenorm",
              &routing);
  p.AddString("moe-backend", "NAME",
              "kernel_config.moe_backend: auto, kplan, emulation, kplan_ep, ...", &moe_backend);
  p.AddString("all2all-backend", "NAME",
              "expert-parallel dispatch: allgather_reducescatter, kplan_all2allv, passthrough",
              &all2all_backend);
  p.AddString("repeat", "R", "run R times with fresh inputs; timings are medians", &repeat);
  p.AddString("dtype", "DTYPE",
              "hidden states: float32, float16, bfloat16 (default: the weights' dtype, else "
              "bfloat16)",
              &dtype);
  p.AddString("seed", "N", "seed of the random inputs", &seed);
  p.AddSwitch("shm",
              "send the tensors by reference: a POSIX shared-memory region is created, registered, "
              "written, read back and removed (the server needs --allow_shared_memory and this "
              "host)",
              &shm);
  p.AddString("output-file", "PATH", "write the last run's output [N, H] there (raw bytes)",
              &output_file);
}

namespace {

// The resident set `id`, for its shapes and dtype.
absl::StatusOr<v1::ExpertsInfo> FindExperts(Client& client, const std::string& id,
                                            const std::string& server) {
  KPLAN_ASSIGN_OR_RETURN(v1::ListExpertsResponse list, client.ListExperts());
  for (const v1::ExpertsInfo& e : list.experts()) {
    if (e.experts_id() == id) return e;
  }
  return absl::NotFoundError(
      absl::StrCat("no expert set '", id, "' on ", server, " (kplan experts lists them)"));
}

absl::StatusOr<MoeRunSummary> RunMoe(const RunMoeFlags& flags, const CommonFlags& common) {
  KPLAN_RETURN_IF_ERROR(Required("id", flags.id));
  KPLAN_RETURN_IF_ERROR(Required("tokens", flags.tokens));
  int64_t tokens = 0, top_k = 0, repeat = 0, seed = 0;
  KPLAN_RETURN_IF_ERROR(ParseInt("tokens", flags.tokens, 1, &tokens));
  KPLAN_RETURN_IF_ERROR(ParseInt("top-k", flags.top_k, 1, &top_k));
  KPLAN_RETURN_IF_ERROR(ParseInt("repeat", flags.repeat, 1, &repeat));
  KPLAN_RETURN_IF_ERROR(ParseInt("seed", flags.seed, 0, &seed));
  std::optional<PlainDType> act;
  if (!flags.dtype.empty()) {
    KPLAN_ASSIGN_OR_RETURN(act, ParsePlainDType("dtype", flags.dtype));
  }
  KPLAN_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, common.Connect());
  KPLAN_ASSIGN_OR_RETURN(v1::ExpertsInfo experts, FindExperts(*client, flags.id, common.server));
  if (!act) {
    absl::StatusOr<PlainDType> weights =
        ParsePlainDType("dtype", rpc::WireFromProtoDType(experts.dtype()));
    act = weights.ok() ? *weights : *ParsePlainDType("dtype", "bfloat16");
  }
  const PlainDType logits_dtype = *ParsePlainDType("dtype", "float32");

  v1::RunMoERequest request;
  request.set_experts_id(flags.id);
  request.mutable_routing()->set_top_k(top_k);
  request.mutable_routing()->set_routing_method(flags.routing);
  request.mutable_kernel_config()->set_moe_backend(flags.moe_backend);
  request.set_explain(true);  // the candidates and their reasons, for the plan shown
  if (!flags.all2all_backend.empty()) {
    request.mutable_parallel()->set_all2all_backend(flags.all2all_backend);
  }
  std::mt19937 rng(static_cast<uint32_t>(seed));
  MoeRunSummary summary;
  summary.experts_id = flags.id;
  summary.tokens = tokens;
  summary.runs = repeat;
  std::vector<double> queue, device, total, round_trip, coalesced;
  std::unique_ptr<ClientShmRegion> shm;  // --shm: [hidden | logits | output], gone on return
  std::string output;
  for (int64_t r = 0; r < repeat; ++r) {
    *request.mutable_hidden_states() = RandomTensor({tokens, experts.hidden_size()}, *act, 1, rng);
    *request.mutable_router_logits() =
        RandomTensor({tokens, experts.num_experts()}, logits_dtype, 2, rng);
    const int64_t out_bytes = static_cast<int64_t>(request.hidden_states().data().size());
    int64_t out_at = 0;
    if (flags.shm) {
      if (shm == nullptr) {
        const int64_t bytes = 2 * out_bytes + request.router_logits().data().size() + 128;
        KPLAN_ASSIGN_OR_RETURN(shm, ClientShmRegion::Create(*client, bytes, "cli"));
      }
      KPLAN_ASSIGN_OR_RETURN(const int64_t logits_at,
                             shm->Place(request.mutable_hidden_states(), 0));
      KPLAN_ASSIGN_OR_RETURN(out_at, shm->Place(request.mutable_router_logits(), logits_at));
      *request.mutable_output_shm() = shm->Ref(out_at, out_bytes);
    }
    const absl::Time start = absl::Now();
    KPLAN_ASSIGN_OR_RETURN(v1::RunMoEResponse response, client->RunMoE(request));
    round_trip.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
    output = flags.shm ? std::string(shm->data() + out_at, out_bytes)
                       : std::move(*response.mutable_output()->mutable_data());
    queue.push_back(response.timing().queue_us());
    device.push_back(response.timing().device_us());
    total.push_back(response.timing().total_us());
    coalesced.push_back(response.timing().coalesced_requests());
    summary.plan = response.plan();
  }
  summary.timing.set_queue_us(Median(queue));
  summary.timing.set_device_us(Median(device));
  summary.timing.set_total_us(Median(total));
  summary.timing.set_coalesced_requests(static_cast<int32_t>(Median(coalesced)));
  summary.round_trip_us = Median(round_trip);
  if (!flags.output_file.empty()) {
    std::ofstream f(flags.output_file, std::ios::binary | std::ios::trunc);
    f.write(output.data(), static_cast<std::streamsize>(output.size()));
    if (!f.good()) {
      return InvalidField("output-file", absl::StrCat("cannot write ", flags.output_file));
    }
  }
  return summary;
}

}  // namespace

int RunMoeCommand(const std::vector<std::string>& args) {
  ArgParser parser;
  CommonFlags common;
  RunMoeFlags flags;
  common.Register(parser);
  flags.Register(parser);
  const std::string synopsis =
      "usage: kplan run-moe --id ID --tokens N [options]\n"
      "\nRun one fused MoE layer over the resident set ID on random hidden states [N, H] and\n"
      "router logits [N, E] (fresh per repeat). Prints the plan (backend, experts kernel,\n"
      "dispatch, devices, the candidates with the reasons they were rejected) and the timing.\n"
      "--shm sends the tensors through a POSIX shared-memory region instead of the messages.\n"
      "Example: kplan run-moe --id layer0 --tokens 64 --top-k 2 --repeat 10";
  if (auto exit = ParseOrExit(parser, args, synopsis)) return *exit;
  absl::StatusOr<MoeRunSummary> summary = RunMoe(flags, common);
  if (!summary.ok()) return Fail(summary.status());
  std::cout << (common.json ? MoeRunToJson(*summary) : FormatMoeRun(*summary));
  return 0;
}

}  // namespace kplan::cli
