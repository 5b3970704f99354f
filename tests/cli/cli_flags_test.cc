// The kplan CLI's flag vocabulary at the parse level: vLLM's spellings
// (--moe-backend / --moe_backend, -tp 2 / -tp=2), the aliases kept for older
// spellings, tri-state and repeated flags, and errors that name the flag.
#include <string>
#include <vector>

#include "base/status.h"
#include "client/cli/args.h"
#include "client/cli/common.h"
#include "client/cli/moe_commands.h"
#include "client/cpp/client.h"
#include "client/cli/resolve_flags.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kplan::cli {
namespace {

using ::testing::HasSubstr;

v1::ResolveKernelConfigRequest ResolveRequest(const std::vector<std::string>& args) {
  ArgParser parser;
  ResolveFlags flags;
  flags.Register(parser);
  absl::Status parsed = parser.Parse(args);
  EXPECT_TRUE(parsed.ok()) << parsed;
  absl::StatusOr<v1::ResolveKernelConfigRequest> request = flags.BuildRequest();
  EXPECT_TRUE(request.ok()) << request.status();
  return request.ok() ? *request : v1::ResolveKernelConfigRequest();
}

TEST(CliFlags, DashesAndUnderscoresAreOneFlag) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--moe-backend", "triton"},
                                               {"--moe_backend", "triton"},
                                               {"--moe-backend=triton"},
                                               {"--moe_backend=triton"}}) {
    EXPECT_EQ(ResolveRequest(args).kernel_config().moe_backend(), "triton") << args[0];
  }
  // Only the name is respelled, never the value.
  EXPECT_EQ(ResolveRequest({"--all2all_backend=deepep_low_latency"}).parallel().all2all_backend(),
            "deepep_low_latency");
}

TEST(CliFlags, VllmShortForms) {
  EXPECT_EQ(ResolveRequest({"-tp", "2"}).parallel().tp_size(), 2);
  EXPECT_EQ(ResolveRequest({"-tp=4"}).parallel().tp_size(), 4);
  EXPECT_EQ(ResolveRequest({"--tensor-parallel-size", "8"}).parallel().tp_size(), 8);
  EXPECT_EQ(ResolveRequest({"--tensor_parallel_size=3"}).parallel().tp_size(), 3);
  EXPECT_EQ(ResolveRequest({"-dp=2"}).parallel().dp_size(), 2);
  EXPECT_TRUE(ResolveRequest({"-ep"}).parallel().enable_expert_parallel());
  EXPECT_FALSE(ResolveRequest({}).parallel().enable_expert_parallel());
}

TEST(CliFlags, TopKAndItsOlderSpelling) {
  const auto moe = [](const std::vector<std::string>& args) {
    return ResolveRequest(args).model().moe();
  };
  EXPECT_EQ(moe({"--top-k", "8"}).experts_per_token(), 8);
  EXPECT_EQ(moe({"--experts-per-token", "6"}).experts_per_token(), 6);
  EXPECT_EQ(moe({"--experts_per_token=4"}).experts_per_token(), 4);
  EXPECT_EQ(moe({"--routing", "DeepSeekV3"}).routing_method(), "DeepSeekV3");
  EXPECT_EQ(moe({"--routing-method", "Llama4"}).routing_method(), "Llama4");
}

TEST(CliFlags, TriStateRepeatedAndLastValueWins) {
  v1::ResolveKernelConfigRequest r =
      ResolveRequest({"--enable-jit-warmup", "--no-enable-cutedsl-warmup", "--env", "A=1",
                      "--env=B=2", "--moe-backend", "triton", "--moe-backend", "deep_gemm"});
  EXPECT_TRUE(r.kernel_config().enable_jit_warmup());
  EXPECT_FALSE(r.kernel_config().enable_cutedsl_warmup());
  EXPECT_TRUE(r.kernel_config().has_enable_cutedsl_warmup());
  EXPECT_FALSE(r.kernel_config().has_enable_flashinfer_autotune());
  EXPECT_EQ(r.env().at("A"), "1");
  EXPECT_EQ(r.env().at("B"), "2");
  EXPECT_EQ(r.kernel_config().moe_backend(), "deep_gemm");
}

absl::Status ParseResolve(const std::vector<std::string>& args) {
  ArgParser parser;
  ResolveFlags flags;
  flags.Register(parser);
  return parser.Parse(args);
}

TEST(CliFlags, ErrorsNameTheFlag) {
  absl::Status unknown = ParseResolve({"--moe-bakend", "triton"});
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("--moe-bakend"));
  EXPECT_EQ(FieldOf(unknown), "moe-bakend");

  absl::Status missing = ParseResolve({"--moe-backend"});
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FieldOf(missing), "moe-backend");

  // One value per --env: a second word is not swallowed.
  EXPECT_EQ(ParseResolve({"--env", "A=1", "B=2"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseResolve({"--enable-eplb=yes-please"}).code(), absl::StatusCode::kInvalidArgument);

  ArgParser parser;
  ResolveFlags flags;
  flags.Register(parser);
  ASSERT_TRUE(parser.Parse({"-tp", "two"}).ok());
  absl::Status bad_int = flags.BuildRequest().status();
  EXPECT_THAT(std::string(bad_int.message()), HasSubstr("--tensor-parallel-size needs an integer"));
}

TEST(CliFlags, LoadTakesResolvesSizeNamesAndTheOldOnes) {
  for (const std::vector<std::string>& sizes :
       {std::vector<std::string>{"--hidden-size", "32", "--intermediate-size", "48"},
        {"--hidden", "32", "--intermediate", "48"},
        {"--hidden_size=32", "--intermediate_size=48"}}) {
    ArgParser parser;
    LoadFlags flags;
    flags.Register(parser);
    std::vector<std::string> args = {"--id", "x", "--random", "--num-experts", "2"};
    args.insert(args.end(), sizes.begin(), sizes.end());
    ASSERT_TRUE(parser.Parse(args).ok()) << sizes[0];
    v1::ExpertsHeader header;
    std::unique_ptr<ChunkSource> source;
    ASSERT_TRUE(flags.Build(&header, &source).ok()) << sizes[0];
    EXPECT_EQ(header.hidden_size(), 32);
    EXPECT_EQ(header.intermediate_size(), 48);
    EXPECT_NE(source, nullptr);
  }
  ArgParser parser;
  LoadFlags flags;
  flags.Register(parser);
  ASSERT_TRUE(
      parser.Parse({"--id", "x", "--random", "--num-experts", "2", "--hidden-size", "8"}).ok());
  v1::ExpertsHeader header;
  std::unique_ptr<ChunkSource> source;
  absl::Status s = flags.Build(&header, &source);
  EXPECT_EQ(FieldOf(s), "intermediate-size");
}

TEST(CliFlags, RunMoeDefaultsAndAliases) {
  ArgParser parser;
  RunMoeFlags flags;
  flags.Register(parser);
  ASSERT_TRUE(parser.Parse({"--id", "a"}).ok());
  EXPECT_EQ(flags.top_k, "2");
  EXPECT_EQ(flags.routing, "RenormalizeNaive");
  ArgParser again;
  RunMoeFlags other;
  other.Register(again);
  ASSERT_TRUE(again.Parse({"--experts-per-token", "4", "--routing_method", "Renormalize"}).ok());
  EXPECT_EQ(other.top_k, "4");
  EXPECT_EQ(other.routing, "Renormalize");
}

TEST(CliFlags, PositionalAlias) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"layer0"}, {"--id", "layer0"}, {"--id=layer0"}}) {
    ArgParser parser;
    std::string id;
    parser.AddString("id", "ID", "the set", &id, /*positional=*/true);
    ASSERT_TRUE(parser.Parse(args).ok()) << args[0];
    EXPECT_EQ(id, "layer0");
  }
  ArgParser parser;
  std::string id;
  parser.AddString("id", "ID", "the set", &id, /*positional=*/true);
  EXPECT_EQ(parser.Parse({"a", "b"}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CliFlags, HelpListsEveryFlagWithItsDefault) {
  ArgParser parser;
  CommonFlags common;
  RunMoeFlags flags;
  common.Register(parser);
  flags.Register(parser);
  ASSERT_TRUE(parser.Parse({"--help"}).ok());
  EXPECT_TRUE(parser.help());
  const std::string help = parser.Help();
  for (const char* flag :
       {"--server", "--timeout", "--tls-ca", "--tls-cert", "--tls-key", "--token-file", "--json",
        "--id", "--tokens", "--top-k", "--experts-per-token", "--routing-method", "--moe-backend",
        "--all2all-backend", "--repeat", "--dtype", "--seed"}) {
    EXPECT_THAT(help, HasSubstr(flag));
  }
  EXPECT_THAT(help, HasSubstr("(default: RenormalizeNaive)"));
  EXPECT_THAT(help, HasSubstr("(default: 10)"));
  ArgParser plain;
  ASSERT_TRUE(plain.Parse({}).ok());
  EXPECT_FALSE(plain.help());
}

TEST(CliFlags, NormalizeLeavesValuesAndTheRestAlone) {
  const std::vector<std::pair<std::string, std::string>> aliases = {
      {"-tp", "tensor-parallel-size"}};
  EXPECT_EQ(
      NormalizeArgs({"--a_b=c_d", "e_f", "-tp=2", "--", "--x_y"}, aliases),
      (std::vector<std::string>{"--a-b=c_d", "e_f", "--tensor-parallel-size=2", "--", "--x_y"}));
}

}  // namespace
}  // namespace kplan::cli
