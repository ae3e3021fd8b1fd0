// safetensors reader and writer: exact round trips, sharded folders, the real
// fixture, and one hand-crafted corrupt file per validation rule, each checked
// for an error naming the file, the tensor and the numbers.
#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "../test_data.h"
#include "core/error.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A fresh directory per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "kestrel-io-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a file of the safetensors layout by hand: the u64 header length
  // (header_len, or the real length when negative), the header, data_size bytes.
  std::string craft(const std::string& name, const std::string& header, size_t data_size,
                    int64_t header_len = -1) const {
    const std::string p = path(name);
    std::ofstream out(p, std::ios::binary);
    const uint64_t n = header_len < 0 ? header.size() : static_cast<uint64_t>(header_len);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
    out << header;
    out << std::string(data_size, '\x01');
    return p;
  }
  void write_text(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
  }

  fs::path dir_;
};

// Runs fn, expecting a kestrel::Error whose message contains every part.
template <typename Fn>
void expect_error(Fn fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& part : parts) {
      EXPECT_NE(msg.find(part), std::string::npos) << "message: " << msg << "\nmissing: " << part;
    }
    return;
  }
  ADD_FAILURE() << "no kestrel::Error thrown";
}

// A TensorSpec whose bytes are a copy of values.
template <typename T>
TensorSpec spec_of(const std::string& name, DType dtype, Shape shape, std::vector<T> values) {
  return {name, dtype, std::move(shape), [values](std::span<std::byte> out) {
            ASSERT_EQ(out.size(), values.size() * sizeof(T));
            if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
          }};
}

template <typename T>
std::vector<T> read_values(const TensorInfo& info) {
  std::vector<T> out(info.nbytes / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), info.data, info.nbytes);
  return out;
}

// The specs of a few tensors of every dtype the models use, with values that
// exercise the bit patterns (negative, subnormal, inf, large integers).
struct Sample {
  std::vector<float> f32 = {0.f, -1.5f, 3.25e-39f, INFINITY, 1e30f, -0.f};
  std::vector<uint16_t> f16 = {0x3c00, 0xbc00, 0x0001, 0x7bff, 0xfc00, 0x8000, 0x3555, 0x7e00};
  std::vector<uint16_t> bf16 = {0x3f80, 0xbf80, 0x0001, 0x7f7f, 0xff80, 0x4049};
  std::vector<int64_t> i64 = {INT64_MIN, -1, 0, 1, INT64_MAX, 1ll << 40};

  std::vector<TensorSpec> specs() const {
    return {spec_of("a.f16", DType::kF16, {2, 4}, f16),  // 2-byte first: writer must realign
            spec_of("b.f32", DType::kF32, {3, 2}, f32), spec_of("c.bf16", DType::kBF16, {6}, bf16),
            spec_of("d.i64", DType::kI64, {1, 2, 3}, i64),
            spec_of<uint8_t>("e.empty", DType::kF32, {0, 7}, {})};
  }
  void check(const WeightStore& store) const {
    EXPECT_EQ(read_values<float>(store.get("b.f32", {3, 2})).size(), 6u);
    const std::vector<float> got = read_values<float>(store.get("b.f32"));
    for (size_t i = 0; i < f32.size(); ++i) {
      EXPECT_EQ(std::memcmp(&got[i], &f32[i], 4), 0) << i;  // bit-exact, -0 included
    }
    EXPECT_EQ(read_values<uint16_t>(store.get("a.f16", {2, 4})), f16);
    EXPECT_EQ(read_values<uint16_t>(store.get("c.bf16", {6})), bf16);
    EXPECT_EQ(read_values<int64_t>(store.get("d.i64", {1, 2, 3})), i64);
    EXPECT_EQ(store.get("a.f16").dtype, DType::kF16);
    EXPECT_EQ(store.get("b.f32").dtype, DType::kF32);
    EXPECT_EQ(store.get("c.bf16").dtype, DType::kBF16);
    EXPECT_EQ(store.get("d.i64").dtype, DType::kI64);
    EXPECT_EQ(store.get("e.empty", {0, 7}).nbytes, 0u);
    for (const std::string& name : store.names()) {
      const TensorInfo& info = store.get(name);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(info.data) % dtype_size(info.dtype), 0u) << name;
    }
  }
};

// ---------------------------------------------------------------------------
// Round trips

TEST_F(SafetensorsTest, RoundTripIsExact) {
  const Sample sample;
  write_safetensors(path("x.safetensors"), sample.specs(), {{"note", "hi"}});
  const WeightStore store = WeightStore::open_file(path("x.safetensors"));
  sample.check(store);
  EXPECT_EQ(store.names(),
            (std::vector<std::string>{"a.f16", "b.f32", "c.bf16", "d.i64", "e.empty"}));

  auto file = SafetensorsFile::open(path("x.safetensors"));
  EXPECT_EQ(file->metadata().at("note"), "hi");
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->find("nope"), nullptr);
  ASSERT_NE(file->find("c.bf16"), nullptr);
  EXPECT_EQ(file->find("c.bf16")->file, path("x.safetensors"));
  EXPECT_FALSE(fs::exists(path("x.safetensors.partial")));
}

TEST_F(SafetensorsTest, HeaderIsPaddedToEightBytes) {
  for (int n = 1; n <= 9; ++n) {  // names of varying length move the header size about
    const std::string p = path("pad" + std::to_string(n) + ".safetensors");
    write_safetensors(p, {spec_of<float>(std::string(n, 'w'), DType::kF32, {1}, {2.f})});
    std::ifstream in(p, std::ios::binary);
    uint64_t len = 0;
    in.read(reinterpret_cast<char*>(&len), 8);
    EXPECT_EQ(len % 8, 0u);
    EXPECT_EQ(fs::file_size(p), 8 + len + 4);
    EXPECT_EQ(read_values<float>(WeightStore::open_file(p).get(std::string(n, 'w'))),
              std::vector<float>{2.f});
  }
}

TEST_F(SafetensorsTest, InMemoryTensorOverload) {
  Tensor logits = Tensor::empty(DType::kF32, {2, 3});
  for (int i = 0; i < 6; ++i) logits.data<float>()[i] = 0.5f * i - 1.f;
  Tensor ids = Tensor::empty(DType::kI64, {3});
  for (int i = 0; i < 3; ++i) ids.data<int64_t>()[i] = 1000 * i;
  write_safetensors(path("out.safetensors"), {{"logits", logits}, {"cu_seqlens", ids}});

  const WeightStore store = WeightStore::open_file(path("out.safetensors"));
  EXPECT_EQ(read_values<float>(store.get("logits", {2, 3})),
            (std::vector<float>{-1.f, -0.5f, 0.f, 0.5f, 1.f, 1.5f}));
  EXPECT_EQ(read_values<int64_t>(store.get("cu_seqlens", {3})),
            (std::vector<int64_t>{0, 1000, 2000}));
}

TEST_F(SafetensorsTest, FillIsStreamedOneTensorAtATime) {
  std::vector<size_t> sizes;
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 4; ++i) {
    const std::string name(1, static_cast<char>('a' + i));  // "a".."d"
    specs.push_back({name, DType::kU8, {100 + i}, [&sizes, i](std::span<std::byte> out) {
                       sizes.push_back(out.size());
                       for (auto& b : out) b = static_cast<std::byte>(i);
                     }});
  }
  write_safetensors(path("s.safetensors"), specs);
  EXPECT_EQ(sizes, (std::vector<size_t>{100, 101, 102, 103}));
  const WeightStore store = WeightStore::open_file(path("s.safetensors"));
  EXPECT_EQ(read_values<uint8_t>(store.get("d")), std::vector<uint8_t>(103, 3));
}

TEST_F(SafetensorsTest, FailedFillLeavesNoFile) {
  std::vector<TensorSpec> specs = {
      {"boom", DType::kF32, {4}, [](std::span<std::byte>) { KESTREL_FAIL("fill failed"); }}};
  expect_error([&] { write_safetensors(path("f.safetensors"), specs); }, {"fill failed"});
  EXPECT_FALSE(fs::exists(path("f.safetensors")));
  EXPECT_FALSE(fs::exists(path("f.safetensors.partial")));
}

TEST_F(SafetensorsTest, WriterRejectsDuplicateNames) {
  const std::vector<TensorSpec> specs = {spec_of<float>("w", DType::kF32, {1}, {1.f}),
                                         spec_of<float>("w", DType::kF32, {1}, {2.f})};
  expect_error([&] { write_safetensors(path("d.safetensors"), specs); }, {"'w'", "twice"});
  expect_error([&] { write_sharded_safetensors(path("dd"), specs, 1); }, {"'w'", "twice"});
}

TEST_F(SafetensorsTest, BorrowKeepsTheMappingAlive) {
  write_safetensors(path("b.safetensors"),
                    {spec_of<float>("w", DType::kF32, {2, 2}, {1.f, 2.f, 3.f, 4.f})});
  Tensor t;
  {
    const WeightStore store = WeightStore::open_file(path("b.safetensors"));
    t = store.borrow("w");
  }
  fs::remove(path("b.safetensors"));  // the mapping outlives the directory entry too
  ASSERT_TRUE(t.defined());
  EXPECT_EQ(t.dtype(), DType::kF32);
  EXPECT_EQ(t.shape(), (Shape{2, 2}));
  EXPECT_EQ(t.data<float>()[3], 4.f);
}

// ---------------------------------------------------------------------------
// Folders

TEST_F(SafetensorsTest, ShardedWriteAndOpenFolder) {
  const Sample sample;
  std::vector<TensorSpec> specs = sample.specs();
  // A large tensor to force several shards: 16 + 24 + 12 + 48 + 0 + 4000 bytes.
  std::vector<float> big(1000);
  std::mt19937 rng(7);
  for (float& v : big) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  specs.push_back(spec_of("f.big", DType::kF32, {10, 100}, big));
  write_sharded_safetensors(path("model"), specs, 64);

  const fs::path model = dir_ / "model";
  EXPECT_FALSE(fs::exists(model / "model.safetensors"));
  std::ifstream in(model / "model.safetensors.index.json");
  const json index = json::parse(in);
  EXPECT_EQ(index["metadata"]["total_size"], 16 + 24 + 12 + 48 + 4000);
  EXPECT_EQ(index["weight_map"].size(), specs.size());
  // 64-byte shards: {a, b, c} = 52 bytes, {d, e} = 48 bytes, {f} alone (over the limit).
  EXPECT_EQ(index["weight_map"]["a.f16"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["d.i64"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["f.big"], "model-00003-of-00003.safetensors");
  for (int i = 1; i <= 3; ++i) {
    EXPECT_TRUE(fs::exists(model / ("model-0000" + std::to_string(i) + "-of-00003.safetensors")));
  }

  const WeightStore store = WeightStore::open_folder(model.string());
  sample.check(store);
  EXPECT_EQ(read_values<float>(store.get("f.big", {10, 100})), big);
  EXPECT_EQ(store.get("f.big").file, (model / "model-00003-of-00003.safetensors").string());
  EXPECT_EQ(store.names().size(), specs.size());
}

TEST_F(SafetensorsTest, OneShardIsAPlainModelFile) {
  const Sample sample;
  write_sharded_safetensors(path("model"), sample.specs(), 1ull << 30);
  EXPECT_TRUE(fs::exists(dir_ / "model" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir_ / "model" / "model.safetensors.index.json"));
  sample.check(WeightStore::open_folder(path("model")));
}

TEST_F(SafetensorsTest, FolderOfShardsWithoutIndex) {
  write_safetensors(path("part-a.safetensors"), {spec_of<float>("x", DType::kF32, {1}, {1.f})});
  write_safetensors(path("part-b.safetensors"), {spec_of<float>("y", DType::kF32, {1}, {2.f})});
  const WeightStore store = WeightStore::open_folder(dir_.string());
  EXPECT_EQ(store.names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_TRUE(store.contains("y"));
  EXPECT_FALSE(store.contains("z"));

  write_safetensors(path("part-c.safetensors"), {spec_of<float>("y", DType::kF32, {1}, {3.f})});
  expect_error([&] { WeightStore::open_folder(dir_.string()); },
               {"'y'", "two shards", "part-b.safetensors", "part-c.safetensors"});
}

TEST_F(SafetensorsTest, RealFixture) {
  const std::string dir = test::test_data_dir() + "/falcon7b-mqa-parallel";
  const WeightStore store = WeightStore::open_folder(dir);
  const TensorInfo& qkv = store.get("transformer.h.0.self_attention.query_key_value.weight");
  EXPECT_EQ(qkv.dtype, DType::kBF16);
  EXPECT_EQ(qkv.shape, (Shape{96, 64}));  // 4 heads x 16 + K 16 + V 16, hidden 64
  EXPECT_EQ(qkv.nbytes, 96u * 64u * 2u);
  EXPECT_EQ(store.get("transformer.word_embeddings.weight", {1024, 64}).dtype, DType::kBF16);
  EXPECT_EQ(store.names().size(), 15u);
  // bf16 weights of a freshly initialised model: finite and small.
  const Tensor t = store.borrow("transformer.h.0.self_attention.query_key_value.weight");
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = bf16_to_f32(t.data<uint16_t>()[i]);
    ASSERT_TRUE(std::isfinite(v) && std::fabs(v) < 10.f) << i;
  }
  EXPECT_FALSE(SafetensorsFile::open(dir + "/expected.safetensors")->tensors().empty());
}

// ---------------------------------------------------------------------------
// Corrupt files: each rule of the validation, one file crafted by hand

TEST_F(SafetensorsTest, ShorterThanEightBytes) {
  write_text("short.safetensors", "abcde");
  expect_error([&] { SafetensorsFile::open(path("short.safetensors")); },
               {path("short.safetensors"), "5 bytes", "8-byte"});
  write_text("empty.safetensors", "");
  expect_error([&] { SafetensorsFile::open(path("empty.safetensors")); },
               {path("empty.safetensors"), "0 bytes"});
}

TEST_F(SafetensorsTest, HeaderLengthBeyondFile) {
  const std::string p = craft("long.safetensors", "{}", 40, 1000);
  expect_error([&] { SafetensorsFile::open(p); },
               {p, "header length 1000", "50 bytes", "at most 42"});
  const std::string huge = craft("huge.safetensors", "{}", 0, INT64_MAX);
  expect_error([&] { SafetensorsFile::open(huge); }, {huge, "9223372036854775807"});
}

TEST_F(SafetensorsTest, TruncatedData) {
  write_safetensors(path("full.safetensors"),
                    {spec_of<float>("w.first", DType::kF32, {4}, {1, 2, 3, 4}),
                     spec_of<float>("w.second", DType::kF32, {4}, {5, 6, 7, 8})});
  const uint64_t size = fs::file_size(path("full.safetensors"));
  fs::resize_file(path("full.safetensors"), size - 10);  // cuts into w.second
  expect_error([&] { SafetensorsFile::open(path("full.safetensors")); },
               {path("full.safetensors"), "'w.second'", "[16, 32]", "(22 bytes)", "truncated"});
}

TEST_F(SafetensorsTest, BadJson) {
  const std::string p = craft("bad.safetensors", R"({"w": {"dtype": "F32",)", 0);
  expect_error([&] { SafetensorsFile::open(p); }, {p, "not valid JSON", "22 bytes"});
  const std::string q = craft("nul.safetensors", std::string("{\0}", 3), 0);
  expect_error([&] { SafetensorsFile::open(q); }, {q, "not valid JSON"});
}

TEST_F(SafetensorsTest, HeaderNotAnObject) {
  const std::string p = craft("arr.safetensors", "[1, 2, 3]", 0);
  expect_error([&] { SafetensorsFile::open(p); }, {p, "array", "not an object"});
  const std::string q = craft("entry.safetensors", R"({"w": 5})", 0);
  expect_error([&] { SafetensorsFile::open(q); }, {q, "'w'", "not an object"});
}

TEST_F(SafetensorsTest, UnknownDtype) {
  const std::string p =
      craft("dt.safetensors",
            R"({"h.0.w": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}})", 16);
  expect_error([&] { SafetensorsFile::open(p); }, {p, "'h.0.w'", "F64", "does not handle"});
  const std::string q =
      craft("dt2.safetensors", R"({"w": {"dtype": 7, "shape": [2], "data_offsets": [0, 16]}})", 16);
  expect_error([&] { SafetensorsFile::open(q); }, {q, "'w'", "dtype 7"});
}

TEST_F(SafetensorsTest, OverlappingOffsets) {
  const std::string p = craft("ov.safetensors", R"({
      "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
      "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
      "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]}})",
                              24);
  expect_error([&] { SafetensorsFile::open(p); },
               {p, "'b'", "[8, 24]", "overlaps", "'a'", "[0, 16]"});
}

TEST_F(SafetensorsTest, OffsetsPastTheEnd) {
  const std::string p = craft(
      "end.safetensors", R"({"w": {"dtype": "BF16", "shape": [8], "data_offsets": [4, 20]}})", 12);
  expect_error([&] { SafetensorsFile::open(p); },
               {p, "'w'", "[4, 20]", "past the end", "12 bytes"});
  const std::string q = craft(
      "rev.safetensors", R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [8, 4]}})", 12);
  expect_error([&] { SafetensorsFile::open(q); }, {q, "'w'", "[8, 4]", "begin > end"});
  const std::string r = craft(
      "neg.safetensors", R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [-4, 0]}})", 12);
  expect_error([&] { SafetensorsFile::open(r); }, {r, "'w'", "[-4,0]"});
  const std::string s =
      craft("one.safetensors", R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [4]}})", 12);
  expect_error([&] { SafetensorsFile::open(s); }, {s, "'w'", "[4]", "[begin, end]"});
}

TEST_F(SafetensorsTest, DtypeShapeSizeMismatch) {
  const std::string p = craft(
      "model.safetensors",
      R"({"transformer.h.0.x": {"dtype": "F32", "shape": [5, 4], "data_offsets": [0, 100]}})", 100);
  expect_error([&] { SafetensorsFile::open(p); },
               {p + ": tensor 'transformer.h.0.x' has data_offsets [0, 100] but shape [5, 4] x "
                    "F32 needs 80 bytes"});
  const std::string q = craft(
      "ovf.safetensors",
      R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", 0);
  expect_error([&] { SafetensorsFile::open(q); }, {q, "'w'", "overflows"});
}

TEST_F(SafetensorsTest, BadShape) {
  const std::string p = craft(
      "neg.safetensors", R"({"w": {"dtype": "F32", "shape": [2, -3], "data_offsets": [0, 0]}})", 0);
  expect_error([&] { SafetensorsFile::open(p); }, {p, "'w'", "[2,-3]", "non-negative integers"});
  const std::string q = craft(
      "flt.safetensors", R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 10]}})", 10);
  expect_error([&] { SafetensorsFile::open(q); }, {q, "'w'", "[2.5]", "non-negative integers"});
  const std::string r = craft(
      "str.safetensors", R"({"w": {"dtype": "F32", "shape": "4", "data_offsets": [0, 16]}})", 16);
  expect_error([&] { SafetensorsFile::open(r); }, {r, "'w'", "not an array"});
  const std::string s =
      craft("miss.safetensors", R"({"w": {"dtype": "F32", "data_offsets": [0, 16]}})", 16);
  expect_error([&] { SafetensorsFile::open(s); }, {s, "'w'", "no \"shape\""});
}

TEST_F(SafetensorsTest, MetadataMustMapStrings) {
  const std::string p = craft("meta.safetensors", R"({"__metadata__": {"format": 1}})", 0);
  expect_error([&] { SafetensorsFile::open(p); }, {p, "__metadata__", "'format'", "not a string"});
  const std::string q = craft("meta2.safetensors", R"({"__metadata__": ["pt"]})", 0);
  expect_error([&] { SafetensorsFile::open(q); }, {q, "__metadata__", "not an object"});
}

TEST_F(SafetensorsTest, MissingTensorLookup) {
  write_safetensors(path("model.safetensors"), {spec_of<float>("w", DType::kF32, {1}, {1.f})});
  const WeightStore store = WeightStore::open_folder(dir_.string());
  expect_error([&] { store.get("transformer.h.3.mlp.dense_4h_to_h.weight"); },
               {"tensor 'transformer.h.3.mlp.dense_4h_to_h.weight' not found in " + dir_.string()});
  expect_error([&] { store.borrow("nope"); }, {"'nope'", "not found"});
}

TEST_F(SafetensorsTest, WrongShapeLookup) {
  write_safetensors(path("model.safetensors"),
                    {spec_of<float>("w", DType::kF32, {2, 3}, {1, 2, 3, 4, 5, 6})});
  const WeightStore store = WeightStore::open_folder(dir_.string());
  expect_error(
      [&] {
        store.get("w", {3, 2});
      },
      {"tensor 'w' in " + path("model.safetensors") + " has shape [2, 3], expected [3, 2]"});
}

TEST_F(SafetensorsTest, IndexNamesAMissingShard) {
  write_safetensors(path("model-00001-of-00002.safetensors"),
                    {spec_of<float>("a", DType::kF32, {1}, {1.f})});
  write_text("model.safetensors.index.json", R"({"metadata": {"total_size": 8}, "weight_map": {
      "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
  expect_error([&] { WeightStore::open_folder(dir_.string()); },
               {"model.safetensors.index.json", "'b'", "model-00002-of-00002.safetensors",
                "does not exist"});
}

TEST_F(SafetensorsTest, IndexMapsATensorToTheWrongShard) {
  write_safetensors(path("s1.safetensors"), {spec_of<float>("a", DType::kF32, {1}, {1.f})});
  write_safetensors(path("s2.safetensors"), {spec_of<float>("b", DType::kF32, {1}, {2.f})});
  write_text("model.safetensors.index.json",
             R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})");
  expect_error([&] { WeightStore::open_folder(dir_.string()); },
               {"model.safetensors.index.json", "'b'", "s1.safetensors", "does not hold it"});
}

TEST_F(SafetensorsTest, TensorInTwoShards) {
  write_safetensors(path("s1.safetensors"), {spec_of<float>("a", DType::kF32, {1}, {1.f})});
  write_safetensors(path("s2.safetensors"), {spec_of<float>("a", DType::kF32, {1}, {2.f}),
                                             spec_of<float>("b", DType::kF32, {1}, {2.f})});
  write_text("model.safetensors.index.json",
             R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  expect_error([&] { WeightStore::open_folder(dir_.string()); },
               {"'a'", "two shards", "s1.safetensors", "s2.safetensors"});
}

TEST_F(SafetensorsTest, MalformedIndex) {
  const std::string index = path("model.safetensors.index.json");
  write_text("model.safetensors.index.json", "{\"weight_map\": ");
  expect_error([&] { WeightStore::open_folder(dir_.string()); }, {index, "not valid JSON"});
  write_text("model.safetensors.index.json", R"({"metadata": {}})");
  expect_error([&] { WeightStore::open_folder(dir_.string()); }, {index, "weight_map"});
  write_text("model.safetensors.index.json", R"({"weight_map": {"a": 3}})");
  expect_error([&] { WeightStore::open_folder(dir_.string()); }, {index, "'a'", "not a file name"});
  write_text("model.safetensors.index.json", R"({"weight_map": {"a": "../x.safetensors"}})");
  expect_error([&] { WeightStore::open_folder(dir_.string()); },
               {index, "'a'", "../x.safetensors", "not a file inside"});
  write_text("model.safetensors.index.json", R"({"weight_map": {}})");
  expect_error([&] { WeightStore::open_folder(dir_.string()); }, {index, "no tensors"});
}

TEST_F(SafetensorsTest, CorruptShardNamesTheShard) {
  write_safetensors(path("s1.safetensors"), {spec_of<float>("a", DType::kF32, {1}, {1.f})});
  craft("s2.safetensors", "{}", 0, 99);
  write_text("model.safetensors.index.json",
             R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  expect_error([&] { WeightStore::open_folder(dir_.string()); },
               {path("s2.safetensors"), "header length 99"});
}

TEST_F(SafetensorsTest, OnlyPytorchWeights) {
  write_text("config.json", "{}");
  write_text("pytorch_model.bin", "PK\x03\x04");
  expect_error([&] { WeightStore::open_folder(dir_.string()); },
               {dir_.string(), "pytorch_model.bin", "safetensors", "Convert",
                "from_pretrained('" + dir_.string() + "')", "safe_serialization=True"});
}

TEST_F(SafetensorsTest, MissingOrEmptyFolder) {
  expect_error([&] { WeightStore::open_folder(path("no-such-model")); },
               {path("no-such-model"), "does not exist"});
  fs::create_directory(path("empty"));
  expect_error([&] { WeightStore::open_folder(path("empty")); }, {path("empty"), "is empty"});
  write_text("config.json", "{}");
  expect_error([&] { WeightStore::open_folder(dir_.string()); },
               {dir_.string(), "no model.safetensors", "config.json"});
  expect_error([&] { WeightStore::open_folder(path("config.json")); }, {"not a directory"});
  expect_error([&] { WeightStore::open_file(path("none.safetensors")); },
               {path("none.safetensors"), "cannot open"});
}

}  // namespace
}  // namespace kestrel
