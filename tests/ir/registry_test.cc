#include "server/ir/registry.h"

#include <atomic>
#include <stdexcept>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ir/builtin_ops.h"
#include "resolve/plan/vocabulary.h"

namespace kplan {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// test_op(x: Tensor, scale: float, mode: str = "none") -> Tensor
IrSignature TestSignature() {
  return {{{"x", IrParamType::kTensor, std::nullopt},
           {"scale", IrParamType::kFloat, std::nullopt},
           {"mode", IrParamType::kStr, "none"}},
          1};
}

IrImplFn Noop() {
  return [](const IrArgs&, absl::Span<const TensorView>, const IrExecContext&) {
    return absl::OkStatus();
  };
}

IrOpSpec TestOp(std::string name = "test_op") {
  IrOpSpec s;
  s.name = std::move(name);
  s.signature = TestSignature();
  s.native = Noop();
  return s;
}

IrImplSpec Provider(std::string name, bool supported = true,
                    std::function<bool(const IrArgs&)> pred = nullptr) {
  IrImplSpec s;
  s.provider = std::move(name);
  s.supported = supported;
  if (pred) s.supports_args = IrArgsPredicate{TestSignature().params, std::move(pred)};
  s.signature = TestSignature();
  s.fn = Noop();
  return s;
}

IrArgs Args(int64_t dims) {
  static float data[16] = {1};
  std::vector<int64_t> shape(static_cast<size_t>(dims), 2);
  IrArgs a;
  a.values = {TensorView::Contiguous(data, kernels::DType::kFloat32, shape), 1.0,
              std::string("none")};
  return a;
}

// A registry whose warnings land in a vector.
struct Fixture {
  IrRegistry registry;
  std::vector<std::string> warnings;
  std::mutex mu;
  Fixture() {
    registry.SetWarningSink([this](const std::string& w) {
      std::lock_guard<std::mutex> lock(mu);
      warnings.push_back(w);
    });
  }
};

constexpr char kInvalidNameTail[] =
    "' is invalid. Names must start with a letter or underscore, followed by lowercase letters, "
    "underscores, or digits only.";

TEST(IrNameTest, FollowsTheNamePattern) {
  for (const char* ok : {"rms_norm", "_private", "a1_2", "x"}) {
    EXPECT_TRUE(ValidateIrName(ok, "Op").ok()) << ok;
  }
  for (const char* bad : {"RmsNorm", "1abc", "a-b", "", "a b", "ä"}) {
    absl::Status s = ValidateIrName(bad, "Provider");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(s.message(), std::string("Provider name '") + bad + kInvalidNameTail);
  }
}

TEST(IrRegistryTest, RegisterOpRules) {
  IrRegistry r;
  absl::StatusOr<IrOp*> op = r.RegisterOp(TestOp("BadName"));
  EXPECT_EQ(op.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(op.status().message(), std::string("Op name 'BadName") + kInvalidNameTail);

  ASSERT_TRUE(r.RegisterOp(TestOp("dup")).ok());
  op = r.RegisterOp(TestOp("dup"));
  EXPECT_EQ(op.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(op.status().message(), "Op 'dup' is already registered.");

  IrOpSpec kw = TestOp("kw_op");
  kw.signature.params[1].keyword_only = true;
  op = r.RegisterOp(std::move(kw));
  EXPECT_EQ(op.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(op.status().message(),
            "Op kw_op has keyword-only arguments which are not currently supported. That's "
            "because kwargs are not allowed during lowering.");

  IrOpSpec inplace = TestOp("inplace_op");
  inplace.allow_inplace = true;
  inplace.signature.outputs = 2;  // one activation ("x"), two outputs
  op = r.RegisterOp(std::move(inplace));
  EXPECT_EQ(op.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(op.status().message(),
            "Inplace overload requires the same number of outputs as activations.");

  EXPECT_THAT(r.OpNames(), ElementsAre("dup"));
}

TEST(IrRegistryTest, NativeIsAlwaysThere) {
  IrRegistry r;
  IrOp* op = *r.RegisterOp(TestOp());
  EXPECT_THAT(op->providers(), ElementsAre("native"));
  const IrOpImpl* native = op->impl("native");
  ASSERT_NE(native, nullptr);
  EXPECT_TRUE(native->supported());
  EXPECT_TRUE(native->supports_all_args());
  EXPECT_THAT(op->activations(), ElementsAre("x"));
  EXPECT_EQ(op->schema(), "(Tensor x, float scale, str mode=\"none\") -> Tensor");
  EXPECT_EQ(op->SetSupported("native", false).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(IrRegistryTest, SchemasOfTheBuiltinOps) {
  IrRegistry r;
  ASSERT_TRUE(RegisterBuiltinIrOps(r, {}).ok());
  EXPECT_EQ(r.Find("rms_norm")->schema(),
            "(Tensor x, Tensor? weight, float epsilon, SymInt? variance_size=None) -> Tensor");
  EXPECT_EQ(r.Find("fused_add_rms_norm")->schema(),
            "(Tensor x, Tensor x_residual, Tensor? weight, float epsilon, SymInt? "
            "variance_size=None) -> (Tensor, Tensor)");
  EXPECT_EQ(r.Find("gelu_and_mul_sparse")->schema(),
            "(Tensor x, float std_multiplier, str approximate=\"none\") -> Tensor");
  EXPECT_THAT(r.Find("fused_add_rms_norm")->activations(), ElementsAre("x", "x_residual"));
  // Every provider vLLM knows is registered; uuids are the vocabulary's.
  for (const std::string& name : r.OpNames()) {
    const IrOp* op = r.Find(name);
    for (absl::string_view p : IrProvidersOf(name)) {
      const IrOpImpl* impl = op->impl(p);
      ASSERT_NE(impl, nullptr) << name << "/" << p;
      EXPECT_EQ(impl->uuid(), IrProviderUuid(name, p));
      EXPECT_FALSE(impl->uuid().empty());
    }
    EXPECT_THAT(op->supported_providers(), ElementsAre("native"));
  }
  IrRegistry with_kplan;
  ASSERT_TRUE(RegisterBuiltinIrOps(with_kplan, {.kplan_supported = true}).ok());
  EXPECT_THAT(with_kplan.Find("rms_norm")->supported_providers(), ElementsAre("native", "kplan"));
}

TEST(IrRegistryTest, RegisterImplRules) {
  IrRegistry r;
  IrOp* op = *r.RegisterOp(TestOp());
  for (const char* reserved : {"native", "unfused"}) {
    absl::Status s = op->RegisterImpl(Provider(reserved));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), std::string("Provider name ") + reserved + " is reserved.");
  }
  absl::Status s = op->RegisterImpl(Provider("Bad-Name"));
  EXPECT_EQ(s.message(), std::string("Provider name 'Bad-Name") + kInvalidNameTail);

  ASSERT_TRUE(op->RegisterImpl(Provider("fast")).ok());
  s = op->RegisterImpl(Provider("fast"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "Implementation for provider fast already registered.");

  IrImplSpec schema = Provider("schema");
  schema.signature.params[1].type = IrParamType::kInt;
  s = op->RegisterImpl(std::move(schema));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "Implementation for provider schema has schema '(Tensor x, SymInt scale, str "
            "mode=\"none\") -> Tensor' which does not match native schema '(Tensor x, float "
            "scale, str mode=\"none\") -> Tensor' for op test_op.");

  IrImplSpec not_callable = Provider("nc");
  not_callable.supports_args = IrArgsPredicate{TestSignature().params, nullptr};
  EXPECT_EQ(op->RegisterImpl(std::move(not_callable)).message(),
            "supports_args for provider nc must be a callable");

  auto always = [](const IrArgs&) { return true; };
  IrImplSpec kw = Provider("kw", true, always);
  kw.supports_args->params[2].keyword_only = true;
  EXPECT_EQ(op->RegisterImpl(std::move(kw)).message(),
            "supports_args for provider kw cannot have keyword-only parameters");

  IrImplSpec count = Provider("count", true, always);
  count.supports_args->params.pop_back();
  EXPECT_EQ(op->RegisterImpl(std::move(count)).message(),
            "supports_args for provider count must have the same number of parameters (2) as "
            "the native implementation (3)");

  IrImplSpec name = Provider("name", true, always);
  name.supports_args->params[1].name = "factor";
  EXPECT_EQ(op->RegisterImpl(std::move(name)).message(),
            "supports_args for provider name has parameter 'factor' which does not match native "
            "parameter 'scale'");

  IrImplSpec def = Provider("def", true, always);
  def.supports_args->params[2].default_value = "tanh";
  EXPECT_EQ(op->RegisterImpl(std::move(def)).message(),
            "supports_args for provider def has parameter 'mode' with default tanh which does "
            "not match native default none'");
  IrImplSpec def2 = Provider("def2", true, always);
  def2.supports_args->params[2].default_value.reset();
  EXPECT_EQ(op->RegisterImpl(std::move(def2)).message(),
            "supports_args for provider def2 has parameter 'mode' with default <class "
            "'inspect._empty'> which does not match native default none'");

  IrImplSpec inplace = Provider("inplace");
  inplace.inplace = true;
  s = op->RegisterImpl(std::move(inplace));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "Inplace implementation cannot be registered for op test_op that does not allow "
            "inplace.");

  EXPECT_THAT(op->providers(), ElementsAre("native", "fast"));
}

TEST(IrRegistryTest, InplaceImplOnInplaceOp) {
  IrRegistry r;
  IrOpSpec spec = TestOp();
  spec.allow_inplace = true;
  IrOp* op = *r.RegisterOp(std::move(spec));
  IrImplSpec inplace = Provider("inplace");
  inplace.inplace = true;
  ASSERT_TRUE(op->RegisterImpl(std::move(inplace)).ok());
  EXPECT_TRUE(op->impl("inplace")->inplace());
}

TEST(IrPriorityTest, FilterDropsUnsupportedAndStopsAtFirstAllArgs) {
  Fixture f;
  IrOp* op = *f.registry.RegisterOp(TestOp());
  ASSERT_TRUE(op->RegisterImpl(Provider("absent", /*supported=*/false)).ok());
  ASSERT_TRUE(op->RegisterImpl(Provider("picky", true, [](const IrArgs&) { return false; })).ok());
  ASSERT_TRUE(op->RegisterImpl(Provider("general")).ok());

  auto names = [](const IrOp::ImplList& l) {
    std::vector<std::string> out;
    for (const IrOpImpl* i : l) out.push_back(i->provider());
    return out;
  };
  EXPECT_THAT(names(*op->FilterPriority({"absent", "picky", "general", "native"})),
              ElementsAre("picky", "general"));
  EXPECT_THAT(names(*op->FilterPriority({"native", "general"})), ElementsAre("native"));
  EXPECT_THAT(f.warnings, IsEmpty());

  const std::string warning =
      "Op test_op: No implementation in priority list supports all args, execution fallback to "
      "native is possible. To silence this warning, explicitly add 'native' to the end of the "
      "priority list";
  std::vector<std::string> collected;
  EXPECT_THAT(names(*op->FilterPriority({"absent", "picky"}, &collected)),
              ElementsAre("picky", "native"));
  EXPECT_THAT(collected, ElementsAre(warning));
  EXPECT_THAT(names(*op->FilterPriority({})), ElementsAre("native"));  // warned once only
  EXPECT_THAT(f.warnings, ElementsAre(warning));

  absl::StatusOr<IrOp::ImplList> bad = op->FilterPriority({"general", "nope"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "All providers in priority must be registered implementations.");
}

TEST(IrDispatchTest, NoPriorityMeansNativeWithAWarningOnce) {
  Fixture f;
  IrOp* op = *f.registry.RegisterOp(TestOp());
  ASSERT_TRUE(op->RegisterImpl(Provider("general")).ok());
  EXPECT_THAT(op->GetPriority(), IsEmpty());
  EXPECT_EQ((*op->Dispatch(Args(2)))->provider(), "native");
  EXPECT_EQ((*op->Dispatch(Args(2)))->provider(), "native");
  EXPECT_THAT(f.warnings,
              ElementsAre("Priority not set for op test_op, using native implementation."));
}

TEST(IrDispatchTest, WalksThePredicates) {
  Fixture f;
  IrOp* op = *f.registry.RegisterOp(TestOp());
  ASSERT_TRUE(op->RegisterImpl(
                    Provider("two_d", true, [](const IrArgs& a) { return a.tensor(0).dim() == 2; }))
                  .ok());
  ASSERT_TRUE(op->RegisterImpl(Provider("three_d", true,
                                        [](const IrArgs& a) { return a.tensor(0).dim() == 3; }))
                  .ok());
  ASSERT_TRUE(op->SetDefault({"two_d", "three_d", "native"}).ok());
  EXPECT_THAT(op->GetDefault(), ElementsAre("two_d", "three_d", "native"));
  EXPECT_EQ((*op->Dispatch(Args(2)))->provider(), "two_d");
  EXPECT_EQ((*op->Dispatch(Args(3)))->provider(), "three_d");
  EXPECT_EQ((*op->Dispatch(Args(1)))->provider(), "native");
  EXPECT_THAT(f.warnings, IsEmpty());

  // A per-call priority wins over the default.
  std::vector<std::string> priority = {"three_d", "native"};
  std::vector<std::string> resolved;
  IrDispatchOptions options{&priority, &resolved, nullptr};
  EXPECT_EQ((*op->Dispatch(Args(2), options))->provider(), "native");
  EXPECT_THAT(resolved, ElementsAre("three_d", "native"));
  std::vector<std::string> unknown = {"nope"};
  EXPECT_EQ(op->Dispatch(Args(2), {&unknown}).status().message(),
            "All providers in priority must be registered implementations.");
}

TEST(IrDispatchTest, ProviderLostAfterFilteringIsAnError) {
  Fixture f;
  IrOp* op = *f.registry.RegisterOp(TestOp());
  ASSERT_TRUE(op->RegisterImpl(Provider("gpu")).ok());
  ASSERT_TRUE(op->SetDefault({"gpu", "native"}).ok());
  ASSERT_TRUE(op->SetSupported("gpu", false).ok());
  absl::StatusOr<const IrOpImpl*> impl = op->Dispatch(Args(2));
  EXPECT_EQ(impl.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(impl.status().message(),
            "Implementation gpu for op test_op not supported. All implementations in priority "
            "list must be supported.");
  // Filtering again drops it.
  ASSERT_TRUE(op->SetDefault({"gpu", "native"}).ok());
  EXPECT_EQ((*op->Dispatch(Args(2)))->provider(), "native");
  EXPECT_EQ(op->SetSupported("nope", true).code(), absl::StatusCode::kNotFound);
}

TEST(IrPriorityTest, ScopesNestAndRestoreOnEveryExit) {
  Fixture f;
  IrOp* op = *f.registry.RegisterOp(TestOp());
  ASSERT_TRUE(op->RegisterImpl(Provider("a")).ok());
  ASSERT_TRUE(op->RegisterImpl(Provider("b")).ok());
  ASSERT_TRUE(op->SetDefault({"native"}).ok());
  {
    IrPriorityScope outer = *op->SetPriority({"a"});
    EXPECT_THAT(op->GetPriority(), ElementsAre("a"));
    {
      IrPriorityScope inner = *op->SetPriority({"b", "native"});
      EXPECT_THAT(op->GetPriority(), ElementsAre("b"));
      EXPECT_EQ((*op->Dispatch(Args(2)))->provider(), "b");
    }
    EXPECT_THAT(op->GetPriority(), ElementsAre("a"));
    EXPECT_EQ((*op->Dispatch(Args(2)))->provider(), "a");
  }
  EXPECT_THAT(op->GetPriority(), ElementsAre("native"));

  // An exception unwinding through the scope restores it.
  try {
    IrPriorityScope scope = *op->SetPriority({"b"});
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  EXPECT_THAT(op->GetPriority(), ElementsAre("native"));

  // An early return does too.
  auto early = [&](bool leave) {
    IrPriorityScope scope = *op->SetPriority({"a"});
    if (leave) return op->GetPriority();
    return std::vector<std::string>{};
  };
  EXPECT_THAT(early(true), ElementsAre("a"));
  EXPECT_THAT(op->GetPriority(), ElementsAre("native"));

  // A failed set_priority changes nothing.
  EXPECT_FALSE(op->SetPriority({"nope"}).ok());
  EXPECT_THAT(op->GetPriority(), ElementsAre("native"));
  // A scope is per thread.
  IrPriorityScope here = *op->SetPriority({"a"});
  std::vector<std::string> seen;
  std::thread([&] { seen = op->GetPriority(); }).join();
  EXPECT_THAT(seen, ElementsAre("native"));
}

TEST(IrPriorityTest, RegisteringWhilePrioritySetWarns) {
  Fixture f;
  IrOp* op = *f.registry.RegisterOp(TestOp());
  ASSERT_TRUE(op->RegisterImpl(Provider("a")).ok());
  EXPECT_THAT(f.warnings, IsEmpty());
  ASSERT_TRUE(op->SetDefault({"a"}).ok());
  ASSERT_TRUE(op->RegisterImpl(Provider("b")).ok());
  EXPECT_THAT(f.warnings,
              ElementsAre("Warning: registering new impl b for op test_op while priority is set."));
}

// Many threads dispatch at once, each with its own per-call or thread-scoped
// priority, while another thread flips the default: nobody sees another's.
TEST(IrConcurrencyTest, OverridesNeverLeakBetweenCallers) {
  Fixture f;
  IrOp* op = *f.registry.RegisterOp(TestOp());
  ASSERT_TRUE(op->RegisterImpl(Provider("alpha")).ok());
  ASSERT_TRUE(op->RegisterImpl(Provider("beta")).ok());
  ASSERT_TRUE(op->RegisterImpl(
                    Provider("gamma", true, [](const IrArgs& a) { return a.tensor(0).dim() == 2; }))
                  .ok());
  ASSERT_TRUE(op->SetDefault({"alpha"}).ok());

  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0};
  std::thread flipper([&] {
    bool beta = false;
    while (!stop.load()) {
      if (!op->SetDefault(beta ? std::vector<std::string>{"beta"}
                               : std::vector<std::string>{"alpha"})
               .ok()) {
        wrong++;
      }
      beta = !beta;
    }
  });
  std::vector<std::thread> threads;
  constexpr int kThreads = 12;
  constexpr int kIters = 3000;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const IrArgs two = Args(2), one = Args(1);
      for (int i = 0; i < kIters; ++i) {
        switch (t % 4) {
          case 0: {
            std::vector<std::string> p = {"alpha"};
            if ((*op->Dispatch(two, {&p}))->provider() != "alpha") wrong++;
            break;
          }
          case 1: {
            std::vector<std::string> p = {"beta", "native"};
            if ((*op->Dispatch(two, {&p}))->provider() != "beta") wrong++;
            break;
          }
          case 2: {
            IrPriorityScope scope = *op->SetPriority({"gamma", "native"});
            if ((*op->Dispatch(two))->provider() != "gamma") wrong++;
            if ((*op->Dispatch(one))->provider() != "native") wrong++;
            break;
          }
          default: {
            const std::string p = (*op->Dispatch(two))->provider();
            if (p != "alpha" && p != "beta") wrong++;
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  stop = true;
  flipper.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_THAT(op->GetPriority(), ::testing::AnyOf(ElementsAre("alpha"), ElementsAre("beta")));
}

}  // namespace
}  // namespace kplan
