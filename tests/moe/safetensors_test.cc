// The safetensors header parser on hostile headers, and LoadSafetensors on
// crafted files under (and outside) model roots in a temporary directory.
// Each hostile class here crashed, hung or over-read before the parser and
// the roots existed: an uncaught JSON type error, an int64 overflow in the
// truncation check, a 99 GiB allocation, a short span loaded as if whole, a
// FIFO blocking open() forever, any readable file of the host.
#include "server/moe/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"
#include "gtest/gtest.h"
#include "base/status.h"
#include "server/moe/expert_loader.h"
#include "server/moe/model_files.h"

namespace kplan {
namespace {

using ::testing::HasSubstr;

std::string LengthPrefix(uint64_t n) {
  std::string out(8, '\0');
  for (int b = 0; b < 8; ++b) out[b] = static_cast<char>((n >> (8 * b)) & 0xff);
  return out;
}

// An entry as JSON text: shape and offsets as given (so tests can put any
// JSON there).
std::string Entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return absl::StrCat("{\"dtype\":", dtype, ",\"shape\":", shape, ",\"data_offsets\":", offsets,
                      "}");
}

absl::Status Parse(const std::string& header, int64_t data_bytes) {
  return ParseSafetensorsHeader(header, data_bytes).status();
}

TEST(SafetensorsHeaderTest, ParsesAValidHeader) {
  const std::string header = absl::StrCat(
      "{\"__metadata__\":{\"format\":\"pt\"},\"b\":", Entry("\"F32\"", "[2,3]", "[24,48]"),
      ",\"a\":", Entry("\"BF16\"", "[3]", "[0,6]"), ",\"z\":", Entry("\"I8\"", "[0,4]", "[6,6]"),
      "}   ");  // trailing spaces: the format pads headers with them
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensorsHeader(header, 48);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->tensors.size(), 3u);
  EXPECT_EQ(h->metadata.at("format"), "pt");
  const SafetensorsEntry& b = h->tensors.at("b");
  EXPECT_EQ(b.dtype, "F32");
  EXPECT_EQ(b.element_bytes, 4);
  EXPECT_EQ(b.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b.begin, 24);
  EXPECT_EQ(b.end, 48);
  EXPECT_EQ(h->tensors.at("z").end - h->tensors.at("z").begin, 0);
}

TEST(SafetensorsHeaderTest, KnowsTheFormatsDTypes) {
  for (const auto& [name, bytes] : std::vector<std::pair<std::string, int64_t>>{{"BOOL", 1},
                                                                                {"U8", 1},
                                                                                {"I8", 1},
                                                                                {"F8_E4M3", 1},
                                                                                {"F8_E5M2", 1},
                                                                                {"I16", 2},
                                                                                {"F16", 2},
                                                                                {"BF16", 2},
                                                                                {"I32", 4},
                                                                                {"F32", 4},
                                                                                {"I64", 8},
                                                                                {"F64", 8}}) {
    EXPECT_EQ(SafetensorsElementBytes(name).value_or(-1), bytes) << name;
    absl::StatusOr<SafetensorsHeader> h = ParseSafetensorsHeader(
        absl::StrCat(
            "{\"t\":", Entry("\"" + name + "\"", "[5]", absl::StrCat("[0,", 5 * bytes, "]")), "}"),
        5 * bytes);
    EXPECT_TRUE(h.ok()) << name << ": " << h.status();
  }
  EXPECT_FALSE(SafetensorsElementBytes("F4").has_value());
  EXPECT_FALSE(SafetensorsElementBytes("f32").has_value());
}

TEST(SafetensorsHeaderTest, OutOfOrderAndOverlappingTensorsAreAllowed) {
  const std::string header = absl::StrCat("{\"a\":", Entry("\"F32\"", "[2]", "[8,16]"),
                                          ",\"b\":", Entry("\"F32\"", "[4]", "[0,16]"), "}");
  EXPECT_TRUE(Parse(header, 16).ok());
}

struct HostileCase {
  std::string name;
  std::string header;
  std::string message;  // a substring of the error
};

std::vector<HostileCase> HostileHeaders() {
  const std::string f32 = "\"F32\"";
  auto one = [](const std::string& entry) { return absl::StrCat("{\"t\":", entry, "}"); };
  std::string deep(100000, '[');
  return {
      {"offsets near INT64_MAX",
       one(Entry(f32, "[2]", "[9223372036854775800,9223372036854775807]")), "past the data"},
      {"end near INT64_MAX", one(Entry(f32, "[2]", "[0,9223372036854775807]")), "past the data"},
      {"offset past int64", one(Entry(f32, "[2]", "[0,9223372036854775808]")), "too large"},
      {"offset past uint64", one(Entry(f32, "[2]", "[0,99999999999999999999999]")),
       "not an integer"},
      {"string dim", one(Entry(f32, "[\"2\"]", "[0,8]")), "a shape dim is a string"},
      {"null dim", one(Entry(f32, "[null]", "[0,8]")), "a shape dim is null"},
      {"string offsets", one(Entry(f32, "[2]", "[\"0\",\"8\"]")), "a data offset is a string"},
      {"null offsets", one(Entry(f32, "[2]", "null")), "data_offsets is null"},
      {"string shape", one(Entry(f32, "\"[2]\"", "[0,8]")), "shape is a string"},
      {"numeric dtype", one(Entry("4", "[2]", "[0,8]")), "dtype is a number"},
      {"float dim", one(Entry(f32, "[2.0]", "[0,8]")), "not an integer"},
      {"negative dim", one(Entry(f32, "[-2]", "[0,8]")), "negative"},
      {"negative offset", one(Entry(f32, "[2]", "[-8,0]")), "negative"},
      {"huge dims", one(Entry(f32, "[4294967296,4294967296,4294967296]", "[0,8]")), "shape"},
      {"dims overflow int64", one(Entry(f32, "[9223372036854775807,3]", "[0,8]")), "shape"},
      {"too many dims", one(Entry(f32, "[1,1,1,1,1,1,1,1,1]", "[0,4]")), "more than 8 dims"},
      {"span shorter than the shape", one(Entry(f32, "[2,2]", "[0,4]")),
       "span 4 bytes; F32 [2, 2] needs 16"},
      {"span longer than the shape", one(Entry(f32, "[1]", "[0,8]")), "needs 4"},
      {"begin after end", one(Entry(f32, "[1]", "[8,4]")), "end before they begin"},
      {"past the data section", one(Entry(f32, "[4]", "[16,32]")), "past the data section"},
      {"one offset", one(Entry(f32, "[1]", "[4]")), "has 1 values"},
      {"three offsets", one(Entry(f32, "[1]", "[0,4,8]")), "more than 2"},
      {"unknown dtype", one(Entry("\"F33\"", "[1]", "[0,4]")), "not a byte-sized"},
      {"sub-byte dtype", one(Entry("\"F4\"", "[2]", "[0,1]")), "not a byte-sized"},
      {"missing shape", one("{\"dtype\":\"F32\",\"data_offsets\":[0,4]}"), "has no shape"},
      {"missing everything", one("{}"), "has no dtype"},
      {"unknown key", one("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}"),
       "unknown key 'x'"},
      {"duplicate field",
       one("{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,4]}"),
       "'dtype' appears twice"},
      {"duplicate tensor",
       absl::StrCat("{\"t\":", Entry(f32, "[1]", "[0,4]"), ",\"t\":", Entry(f32, "[1]", "[0,4]"),
                    "}"),
       "appears twice"},
      {"entry not an object", "{\"t\":[1,2]}", "not an object"},
      {"metadata not an object", "{\"__metadata__\":\"x\"}", "__metadata__ is a string"},
      {"metadata not strings", "{\"__metadata__\":{\"k\":{\"a\":1}}}", "not a string"},
      {"header an array", "[]", "not a JSON object"},
      {"header a number", "5", "not a JSON object"},
      {"header a string", "\"x\"", "not a JSON object"},
      {"header empty", "", "not valid JSON"},
      {"header spaces", "   ", "not valid JSON"},
      {"header truncated", "{\"t\":{\"dtype\":\"F32\"", "not valid JSON"},
      {"trailing garbage", "{} {}", "not valid JSON"},
      {"non-UTF-8 key", "{\"\xff\xfe\":{}}", "not valid JSON"},
      {"non-UTF-8 dtype", one(Entry("\"F\xc3\x28\"", "[1]", "[0,4]")), "not valid JSON"},
      {"NUL in the header", std::string("{\"t\0\":{}}", 9), "not valid JSON"},
      {"deep nesting", deep, "not a JSON object"},
      {"deep nesting in an entry", one(Entry(f32, deep, "[0,4]")), "a shape dim is an array"},
  };
}

TEST(SafetensorsHeaderTest, RejectsHostileHeadersWithoutThrowing) {
  for (const HostileCase& c : HostileHeaders()) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<SafetensorsHeader> h = ParseSafetensorsHeader(c.header, 16);
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << h.status();
    EXPECT_THAT(std::string(h.status().message()), HasSubstr(c.message));
  }
}

TEST(SafetensorsHeaderTest, ErrorsEscapeAndShortenNames) {
  absl::StatusOr<SafetensorsHeader> h =
      ParseSafetensorsHeader(absl::StrCat("{\"", "evil\\n\\u001b[31m", std::string(1000, 'x'),
                                          "\":", Entry("\"F32\"", "[1]", "[0,8]"), "}"),
                             16);
  ASSERT_FALSE(h.ok());
  const std::string message(h.status().message());
  EXPECT_THAT(message, HasSubstr("evil\\x0a\\x1b[31m"));
  EXPECT_EQ(message.find('\n'), std::string::npos);
  EXPECT_LT(message.size(), 400u);
}

TEST(SafetensorsHeaderTest, HeaderLengthIsLittleEndianCappedAndChecked) {
  EXPECT_EQ(SafetensorsHeaderLength(LengthPrefix(0x0102), 0x0102 + 8).value_or(-1), 0x0102);
  EXPECT_EQ(SafetensorsHeaderLength(LengthPrefix(0), 8).value_or(-1), 0);
  // 99 GiB: refused before anything is allocated, even with a file that big.
  absl::StatusOr<int64_t> huge =
      SafetensorsHeaderLength(LengthPrefix(int64_t{99} << 30), int64_t{200} << 30);
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("over the format's limit"));
  absl::StatusOr<int64_t> max = SafetensorsHeaderLength(LengthPrefix(UINT64_MAX), INT64_MAX);
  EXPECT_FALSE(max.ok());
  EXPECT_THAT(std::string(SafetensorsHeaderLength(LengthPrefix(100), 50).status().message()),
              HasSubstr("truncated"));
  EXPECT_THAT(std::string(SafetensorsHeaderLength("abc", 3).status().message()),
              HasSubstr("not a safetensors file"));
  EXPECT_FALSE(SafetensorsHeaderLength(LengthPrefix(0), 7).ok());
}

// --- LoadSafetensors on files ------------------------------------------------

constexpr int kE = 2, kH = 8, kI = 4;

ExpertsSpec Spec() {
  ExpertsSpec s;
  s.experts_id = "st";
  s.num_experts = kE;
  s.hidden = kH;
  s.intermediate = kI;
  s.activation = "silu";
  s.dtype = kernels::DType::kFloat32;
  return s;
}

SafetensorsNames Stacked() {
  SafetensorsNames n;
  n.w13 = "w13";
  n.w2 = "w2";
  return n;
}

// Large loads log every tenth of their bytes; small ones stay quiet. An
// expert is done when its rows of every tensor are.
TEST(LoadProgressTest, CountsBytesAndExpertsAndLogsEachTenthOfALargeLoad) {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  spdlog::default_logger()->sinks().push_back(sink);
  const kernels::DType f32 = kernels::DType::kFloat32;
  {
    LoadProgress small("small", {{"w", f32, {1, 256 << 10}, "float32"}}, 1);
    small.Add("w", 1 << 20);
    EXPECT_EQ(small.done().experts, 1);
    // 100 experts, 50 MiB per tensor: 0.5 MiB of each per expert.
    LoadProgress large(
        "big-set",
        {{"w13", f32, {100, 128 << 10}, "float32"}, {"w2", f32, {100, 128 << 10}, "float32"}}, 100);
    for (int i = 0; i < 40; ++i) {
      large.Add(i < 20 ? "w13" : "w2", int64_t{5} << 19);  // 2.5 MiB each, 100 MiB in all
      const LoadProgress::Done d = large.done();
      EXPECT_EQ(d.bytes, (i + 1) * (int64_t{5} << 19));
      EXPECT_EQ(d.bytes_total, int64_t{100} << 20);
      EXPECT_EQ(d.experts_total, 100);
      EXPECT_EQ(d.experts, i < 20 ? 0 : (i - 19) * 5) << i;  // w2 complete for 5 more each
    }
  }
  spdlog::default_logger()->sinks().pop_back();
  const std::vector<std::string> lines = sink->last_formatted();
  ASSERT_EQ(lines.size(), 10u);
  for (int i = 0; i < 10; ++i) {
    EXPECT_THAT(lines[i], HasSubstr(absl::StrCat("LoadExperts 'big-set': ", (i + 1) * 10, "% (",
                                                 (i + 1) * 10, " MiB of 100 MiB)")));
  }
}

TEST(SafetensorsIndexTest, ParsesHuggingFacesIndex) {
  absl::StatusOr<SafetensorsIndex> index = ParseSafetensorsIndex(
      "{\"metadata\": {\"total_size\": 1234, \"nested\": [1, {\"a\": [null, true]}]},"
      " \"weight_map\": {\"w13\": \"model-00001-of-00002.safetensors\","
      " \"w2\": \"model-00002-of-00002.safetensors\"}}");
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->weight_map.size(), 2u);
  EXPECT_EQ(index->weight_map.at("w2"), "model-00002-of-00002.safetensors");
}

TEST(SafetensorsIndexTest, RejectsHostileIndexes) {
  const std::string deep = std::string(65, '[') + std::string(65, ']');
  const std::string ok_deep = std::string(64, '[') + std::string(64, ']');
  EXPECT_TRUE(
      ParseSafetensorsIndex(absl::StrCat("{\"m\":", ok_deep, ",\"weight_map\":{\"a\":\"s\"}}"))
          .ok());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[]", "not a JSON object"},
      {"{}", "no weight_map"},
      {"{\"weight_map\":{}}", "names no tensor"},
      {"{\"weight_map\":[]}", "an array"},
      {"{\"weight_map\":7}", "a number"},
      {"{\"weight_map\":{\"a\":\"../x.safetensors\"}}", "not a plain file name"},
      {"{\"weight_map\":{\"a\":\"/etc/passwd\"}}", "not a plain file name"},
      {"{\"weight_map\":{\"a\":\"..\"}}", "not a plain file name"},
      {"{\"weight_map\":{\"a\":\"\"}}", "not a plain file name"},
      {std::string("{\"weight_map\":{\"a\":\"x\\u0000y\"}}"), "not a plain file name"},
      {"{\"weight_map\":{\"a\":1}}", "maps to a number"},
      {"{\"weight_map\":{\"a\":{}}}", "maps to a container"},
      {"{\"weight_map\":{\"a\":\"s\",\"a\":\"t\"}}", "appears twice"},
      {"{\"weight_map\":{\"a\":\"s\"},\"weight_map\":{\"b\":\"s\"}}", "appears twice"},
      {absl::StrCat("{\"m\":", deep, ",\"weight_map\":{\"a\":\"s\"}}"), "nests deeper"},
      {"{\"weight_map\":{\"a\":\"s\"}", "not valid JSON"},
      {"{\"weight_map\":{\"a\":\"s\"}} x", "not valid JSON"},
  };
  for (const auto& [text, message] : cases) {
    SCOPED_TRACE(text);
    absl::StatusOr<SafetensorsIndex> index = ParseSafetensorsIndex(text);
    ASSERT_FALSE(index.ok());
    EXPECT_EQ(index.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(index.status().message()), HasSubstr(message));
  }
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string FileOf(const std::string& header, const std::string& data) {
  return LengthPrefix(header.size()) + header + data;
}

class SafetensorsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = absl::StrCat(::testing::TempDir(), "/st-XXXXXX");
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
    root_ = dir_ + "/models";
    outside_ = dir_ + "/models2";  // shares the root's prefix, not its directory
    ASSERT_EQ(mkdir(root_.c_str(), 0755), 0);
    ASSERT_EQ(mkdir(outside_.c_str(), 0755), 0);
    roots_ = {root_};
    // w13 [E, 2I, H] then w2 [E, H, I], float32, distinct values.
    const int64_t n13 = kE * 2 * kI * kH, n2 = kE * kH * kI;
    for (int64_t i = 0; i < n13 + n2; ++i) {
      const float v = 0.25f * static_cast<float>(i) - 3.f;
      data_.append(reinterpret_cast<const char*>(&v), 4);
    }
    header_ = absl::StrCat(
        "{\"w13\":", Entry("\"F32\"", "[2,8,8]", absl::StrCat("[0,", n13 * 4, "]")), ",\"w2\":",
        Entry("\"F32\"", "[2,8,4]", absl::StrCat("[", n13 * 4, ",", (n13 + n2) * 4, "]")), "}");
    WriteFile(root_ + "/good.safetensors", FileOf(header_, data_));
    WriteFile(outside_ + "/good.safetensors", FileOf(header_, data_));
  }

  void TearDown() override {
    std::string cmd = absl::StrCat("rm -rf '", dir_, "'");
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }

  absl::StatusOr<std::unique_ptr<ExpertSet>> Load(const std::string& path) const {
    return LoadSafetensors(Spec(), path, Stacked(), roots_);
  }

  // The one answer for every refused path.
  void ExpectRefused(const absl::Status& s) const {
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_EQ(s.message(), kNotUnderModelRoots) << s;
    EXPECT_EQ(FieldOf(s).value_or(""), "safetensors.path") << s;
  }

  std::string dir_, root_, outside_, header_, data_;
  std::vector<std::string> roots_;
};

TEST_F(SafetensorsFileTest, LoadsAValidFileUnderARoot) {
  absl::StatusOr<std::unique_ptr<ExpertSet>> set = Load(root_ + "/good.safetensors");
  ASSERT_TRUE(set.ok()) << set.status();
  const size_t n13 = kE * 2 * kI * kH * 4;
  EXPECT_EQ((*set)->tensors().at("w13"), data_.substr(0, n13));
  EXPECT_EQ((*set)->tensors().at("w2"), data_.substr(n13));
  // Relative paths resolve under the first root; ".." that stays inside is fine.
  EXPECT_TRUE(Load("good.safetensors").ok());
  ASSERT_EQ(mkdir((root_ + "/sub").c_str(), 0755), 0);
  EXPECT_TRUE(Load("sub/../good.safetensors").ok());
  // A symlink inside the roots to a file inside the roots is fine.
  ASSERT_EQ(symlink((root_ + "/good.safetensors").c_str(), (root_ + "/link").c_str()), 0);
  EXPECT_TRUE(Load(root_ + "/link").ok());
  // Any root will do for an absolute path; a root given with a trailing slash too.
  EXPECT_TRUE(LoadSafetensors(Spec(), outside_ + "/good.safetensors", Stacked(),
                              std::vector<std::string>{root_, outside_ + "/"})
                  .ok());
}

TEST_F(SafetensorsFileTest, TensorsInAnyOrderLoad) {
  const int64_t n13 = kE * 2 * kI * kH * 4, n2 = kE * kH * kI * 4;
  // w2 first in the data section, w13 after it.
  const std::string header = absl::StrCat(
      "{\"w2\":", Entry("\"F32\"", "[2,8,4]", absl::StrCat("[0,", n2, "]")),
      ",\"w13\":", Entry("\"F32\"", "[2,8,8]", absl::StrCat("[", n2, ",", n2 + n13, "]")), "}");
  WriteFile(root_ + "/swapped.safetensors",
            FileOf(header, data_.substr(n13) + data_.substr(0, n13)));
  absl::StatusOr<std::unique_ptr<ExpertSet>> set = Load(root_ + "/swapped.safetensors");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ((*set)->tensors().at("w13"), data_.substr(0, n13));
}

TEST_F(SafetensorsFileTest, ShardedCheckpointLoadsThroughItsIndex) {
  const int64_t n13 = kE * 2 * kI * kH * 4, n2 = kE * kH * kI * 4;
  ASSERT_EQ(mkdir((root_ + "/sharded").c_str(), 0755), 0);
  WriteFile(root_ + "/sharded/model-00001-of-00002.safetensors",
            FileOf(absl::StrCat("{\"w13\":",
                                Entry("\"F32\"", "[2,8,8]", absl::StrCat("[0,", n13, "]")), "}"),
                   data_.substr(0, n13)));
  WriteFile(root_ + "/sharded/model-00002-of-00002.safetensors",
            FileOf(absl::StrCat(
                       "{\"w2\":", Entry("\"F32\"", "[2,8,4]", absl::StrCat("[0,", n2, "]")), "}"),
                   data_.substr(n13)));
  const std::string index = root_ + "/sharded/model.safetensors.index.json";
  WriteFile(index,
            "{\"metadata\":{\"total_size\":1},\"weight_map\":{"
            "\"w13\":\"model-00001-of-00002.safetensors\","
            "\"w2\":\"model-00002-of-00002.safetensors\"}}");
  absl::StatusOr<std::unique_ptr<ExpertSet>> set = Load(index);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ((*set)->tensors().at("w13"), data_.substr(0, n13));
  EXPECT_EQ((*set)->tensors().at("w2"), data_.substr(n13));
  EXPECT_TRUE(Load("sharded/model.safetensors.index.json").ok());

  // A tensor the index does not list, and a shard that is missing.
  WriteFile(index, "{\"weight_map\":{\"w13\":\"model-00001-of-00002.safetensors\"}}");
  set = Load(index);
  ASSERT_FALSE(set.ok());
  EXPECT_THAT(std::string(set.status().message()), HasSubstr("has no tensor 'w2'"));
  WriteFile(index,
            "{\"weight_map\":{\"w13\":\"model-00001-of-00002.safetensors\","
            "\"w2\":\"gone.safetensors\"}}");
  ExpectRefused(Load(index).status());
  // A shard that is a symlink out of the roots is refused like any path.
  ASSERT_EQ(symlink((outside_ + "/good.safetensors").c_str(),
                    (root_ + "/sharded/out.safetensors").c_str()),
            0);
  WriteFile(index,
            "{\"weight_map\":{\"w13\":\"model-00001-of-00002.safetensors\","
            "\"w2\":\"out.safetensors\"}}");
  ExpectRefused(Load(index).status());
  // A shard name with a path in it never reaches the file system.
  WriteFile(index,
            "{\"weight_map\":{\"w13\":\"../good.safetensors\","
            "\"w2\":\"model-00002-of-00002.safetensors\"}}");
  set = Load(index);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(set.status().message()), HasSubstr("not a plain file name"));
  EXPECT_EQ(FieldOf(set.status()).value_or(""), "safetensors.path");
  // A shard whose content is wrong names the shard.
  WriteFile(root_ + "/sharded/model-00002-of-00002.safetensors", "garbage!garbage!");
  WriteFile(index,
            "{\"weight_map\":{\"w13\":\"model-00001-of-00002.safetensors\","
            "\"w2\":\"model-00002-of-00002.safetensors\"}}");
  set = Load(index);
  ASSERT_FALSE(set.ok());
  EXPECT_THAT(std::string(set.status().message()), HasSubstr("shard model-00002-of-00002"));
}

TEST_F(SafetensorsFileTest, NoRootsMeansServerSideLoadsAreOff) {
  absl::StatusOr<std::unique_ptr<ExpertSet>> set =
      LoadSafetensors(Spec(), root_ + "/good.safetensors", Stacked(), {});
  EXPECT_EQ(set.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(set.status().message(), kServerSideLoadsOff);
  EXPECT_EQ(FieldOf(set.status()).value_or(""), "safetensors.path");
}

TEST_F(SafetensorsFileTest, RefusesEverythingOutsideTheRootsWithOneText) {
  ASSERT_EQ(symlink((outside_ + "/good.safetensors").c_str(), (root_ + "/out").c_str()), 0);
  ASSERT_EQ(symlink(outside_.c_str(), (root_ + "/outdir").c_str()), 0);
  ASSERT_EQ(symlink("/dev/zero", (root_ + "/zero").c_str()), 0);
  ASSERT_EQ(symlink("/proc/self/mem", (root_ + "/mem").c_str()), 0);
  ASSERT_EQ(mkdir((root_ + "/dir.safetensors").c_str(), 0755), 0);
  const std::vector<std::string> refused = {
      outside_ + "/good.safetensors",          // outside, sharing the root's prefix
      "../models2/good.safetensors",           // relative ".." out of the first root
      root_ + "/../models2/good.safetensors",  // absolute ".." out
      root_ + "/out",                          // a symlink out
      root_ + "/outdir/good.safetensors",      // through a symlinked directory out
      root_ + "/missing.safetensors",          // missing, under the root
      outside_ + "/missing.safetensors",       // missing, outside
      "/etc/shadow",
      "/etc/passwd",
      "/proc/self/mem",
      root_ + "/mem",
      "/dev/zero",
      root_ + "/zero",
      root_ + "/dir.safetensors",
      root_,
      "/",
      root_ + "/good.safetensors/",                     // a file is not a directory
      root_ + std::string("/good.safetensors\0x", 19),  // NUL inside
      std::string(5000, 'a'),                           // past PATH_MAX
  };
  for (const std::string& path : refused) {
    SCOPED_TRACE(path);
    ExpectRefused(Load(path).status());
  }
}

TEST_F(SafetensorsFileTest, RefusesDevicesEvenUnderARoot) {
  ExpectRefused(
      LoadSafetensors(Spec(), "/dev/zero", Stacked(), std::vector<std::string>{"/dev"}).status());
  ExpectRefused(
      LoadSafetensors(Spec(), "null", Stacked(), std::vector<std::string>{"/dev"}).status());
}

TEST_F(SafetensorsFileTest, UnreadableFileIsRefusedLikeAMissingOne) {
  const std::string path = root_ + "/secret.safetensors";
  WriteFile(path, FileOf(header_, data_));
  ASSERT_EQ(chmod(path.c_str(), 0), 0);
  if (geteuid() != 0) {
    ExpectRefused(Load(path).status());
    return;
  }
  // Root reads mode-000 files: check as "nobody" in a child, which must
  // still read the readable file next to it.
  ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);  // mkdtemp made it 0700
  ASSERT_EQ(chmod((root_ + "/good.safetensors").c_str(), 0644), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    if (!Load(root_ + "/good.safetensors").ok()) _exit(3);
    const absl::Status s = Load(path).status();
    _exit(s.code() == absl::StatusCode::kPermissionDenied && s.message() == kNotUnderModelRoots
              ? 0
              : 4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 2) GTEST_SKIP() << "cannot become nobody (65534) here";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: the readable file failed, 4: the unreadable one was "
                                       "not refused with the one text";
}

TEST_F(SafetensorsFileTest, FifoIsRefusedPromptly) {
  const std::string fifo = root_ + "/fifo.safetensors";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  std::future<absl::Status> loaded =
      std::async(std::launch::async, [&] { return Load(fifo).status(); });
  if (loaded.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    // Unblock the reader stuck in open() so the test can end, then fail.
    const int fd = open(fifo.c_str(), O_RDWR | O_NONBLOCK);
    loaded.wait();
    if (fd >= 0) close(fd);
    FAIL() << "LoadSafetensors blocked on a FIFO";
  }
  ExpectRefused(loaded.get());
}

TEST_F(SafetensorsFileTest, HostileFilesAreRejected) {
  const int64_t n13 = kE * 2 * kI * kH * 4, n2 = kE * kH * kI * 4;
  const std::string w2 = Entry("\"F32\"", "[2,8,4]", absl::StrCat("[", n13, ",", n13 + n2, "]"));
  auto with_w13 = [&](const std::string& w13) {
    return absl::StrCat("{\"w13\":", w13, ",\"w2\":", w2, "}");
  };
  struct Case {
    std::string name, bytes, message;
  };
  const std::vector<Case> cases = {
      {"offsets near INT64_MAX",
       FileOf(with_w13(Entry("\"F32\"", "[2,8,8]", "[9223372036854775000,9223372036854775807]")),
              data_),
       "past the data section"},
      {"string dim", FileOf(with_w13(Entry("\"F32\"", "[\"2\",8,8]", "[0,512]")), data_),
       "a shape dim is a string"},
      {"null offsets", FileOf(with_w13(Entry("\"F32\"", "[2,8,8]", "[null,512]")), data_),
       "a data offset is null"},
      {"99 GiB header length", LengthPrefix(int64_t{99} << 30) + header_ + data_,
       "over the format's limit"},
      // The span says 4 bytes: before, this loaded and RunMoE read past them.
      {"span shorter than the shape", FileOf(with_w13(Entry("\"F32\"", "[2,8,8]", "[0,4]")), data_),
       "needs 512"},
      {"negative dim", FileOf(with_w13(Entry("\"F32\"", "[-2,8,8]", "[0,512]")), data_),
       "negative"},
      {"begin after end", FileOf(with_w13(Entry("\"F32\"", "[2,8,8]", "[512,0]")), data_),
       "end before they begin"},
      {"duplicate key", FileOf(absl::StrCat("{\"w2\":", w2, ",", with_w13(w2).substr(1)), data_),
       "appears twice"},
      {"header not an object", FileOf("[]", data_), "not a JSON object"},
      {"non-UTF-8", FileOf("{\"w\xff\":1}", data_), "not valid JSON"},
      {"header length 0", FileOf("", data_), "not valid JSON"},
      {"smaller than 8 bytes", std::string("\x02\0\0", 3), "not a safetensors file"},
      {"empty file", "", "not a safetensors file"},
      {"data section truncated", FileOf(header_, data_.substr(0, data_.size() / 2)), "truncated"},
      {"wrong shape for the spec", FileOf(with_w13(Entry("\"F32\"", "[2,4,16]", "[0,512]")), data_),
       "expected F32 [2, 8, 8]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = root_ + "/hostile.safetensors";
    WriteFile(path, c.bytes);
    absl::StatusOr<std::unique_ptr<ExpertSet>> set = Load(path);
    ASSERT_FALSE(set.ok());
    EXPECT_EQ(set.status().code(), absl::StatusCode::kInvalidArgument) << set.status();
    EXPECT_THAT(std::string(set.status().message()), HasSubstr(c.message));
    EXPECT_THAT(FieldOf(set.status()).value_or(""), HasSubstr("safetensors")) << set.status();
  }
}

}  // namespace
}  // namespace kplan
