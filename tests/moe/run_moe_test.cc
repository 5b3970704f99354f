// RunMoE's core without gRPC (server/moe/run_moe.h), on the CPU: the route
// for auto / emulation / explicit backends, the expert-parallel strategy and
// its errors (vLLM's texts), the plan and timing of the CPU path and of a
// CPU expert-parallel group, and the call's hooks (deadline, fail).
#include "server/moe/run_moe.h"

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "base/status.h"
#include "resolve/platform/local.h"
#include "tests/moe/cpu_run_moe_test.h"

namespace kplan {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kExperts = 8;
constexpr int64_t kHidden = 64;
constexpr int64_t kInter = 32;
constexpr int64_t kTokens = 3;

ExpertsSpec Spec() {
  ExpertsSpec s;
  s.experts_id = "cpu-mix";
  s.num_experts = kExperts;
  s.hidden = kHidden;
  s.intermediate = kInter;
  s.dtype = kernels::DType::kBFloat16;
  return s;
}

// Every tensor of the spec, zero bytes (outputs are zero; only the plan matters).
std::shared_ptr<ExpertSet> MakeSet() {
  std::map<std::string, std::string> tensors;
  for (const TensorSpec& t : ExpectedTensors(Spec())) {
    tensors[t.name] = std::string(static_cast<size_t>(t.bytes()), '\0');
  }
  return std::make_shared<ExpertSet>(Spec(), std::move(tensors));
}

// Routed by logits (Renormalize, top-2).
MoeRunInput Input() {
  MoeRunInput in;
  in.act_dtype = kernels::DType::kBFloat16;
  in.hidden_shape = {kTokens, kHidden};
  in.hidden_states.assign(kTokens * kHidden * 2, '\0');
  in.logits_shape = {kTokens, kExperts};
  in.router_logits.assign(kTokens * kExperts * 4, '\0');
  in.routing.routing_method = "Renormalize";
  in.routing.top_k = 2;
  return in;
}

using Outcome = RunMoeOutcome;

class RunMoeTest : public CpuRunMoeTest {
 protected:
  RunMoeRequest Request(const std::string& backend = "auto",
                        std::shared_ptr<const ExpertSet> set = nullptr) {
    RunMoeRequest r;
    r.experts = set != nullptr ? std::move(set) : MakeSet();
    r.input = Input();
    r.moe_backend = backend;
    r.return_routing = true;
    return r;
  }

  // Runs `request` and waits for its answer; a synchronous refusal is the
  // outcome's status.
  Outcome Run(RunMoeRequest request, RunMoeCall call = {}) {
    return Start(std::move(request), std::move(call)).get();
  }
};

TEST(ExecutableMoeBackendsTest, KplanOnlyWithCudaKernelsAndDevices) {
  EXPECT_THAT(ExecutableMoeBackends(false), ElementsAre("emulation"));
  if (BuildFacts().have_cuda_kernels) {
    EXPECT_THAT(ExecutableMoeBackends(true), ElementsAre("kplan", "emulation"));
  } else {
    EXPECT_THAT(ExecutableMoeBackends(true), ElementsAre("emulation"));
  }
}

TEST_F(RunMoeTest, AutoRunsTheCpuReferenceWithTheOraclePlan) {
  RunMoeRequest explained = Request("auto");
  explained.explain = true;
  Outcome o = Run(std::move(explained));
  ASSERT_TRUE(o.result.ok()) << o.result.status();
  const MoeExecutionPlan& plan = o.result->plan;
  EXPECT_EQ(plan.backend, "emulation");
  EXPECT_EQ(plan.experts_kernel, "KplanEmulationExperts");
  EXPECT_EQ(plan.dispatch, "MoEPrepareAndFinalizeNoDPEPModular");
  EXPECT_THAT(plan.devices, ElementsAre("cpu"));
  ASSERT_EQ(plan.candidates.size(), 1u);
  EXPECT_EQ(plan.candidates[0].backend, "EMULATION");
  EXPECT_TRUE(plan.candidates[0].accepted);
  EXPECT_EQ(plan.all2all_backend, "");
  EXPECT_EQ(plan.ep_size, 0);
  EXPECT_EQ(o.result->output.num_tokens, kTokens);
  EXPECT_EQ(o.result->output.output.size(), static_cast<size_t>(kTokens * kHidden * 2));
  EXPECT_EQ(o.result->output.topk_ids.size(), static_cast<size_t>(kTokens * 2));
  // The hops, in order; without explain the same plan comes without candidates.
  EXPECT_LE(o.timing.queued, o.timing.device_start);
  EXPECT_LE(o.timing.device_start, o.timing.device_end);
  EXPECT_EQ(o.timing.device, o.timing.device_end - o.timing.device_start);
  Outcome plain = Run(Request("auto"));
  ASSERT_TRUE(plain.result.ok()) << plain.result.status();
  EXPECT_EQ(plain.result->plan.backend, "emulation");
  EXPECT_TRUE(plain.result->plan.candidates.empty());
  EXPECT_GT(o.timing.device, absl::ZeroDuration());
  EXPECT_GE(o.timing.queue, absl::ZeroDuration());
}

// With inline runs allowed, an idle worker's job runs inside RunMoe on the
// calling thread, with the same answer as through the worker.
TEST_F(RunMoeTest, InlineRunsAnswerBeforeRunMoeReturns) {
  std::shared_ptr<const ExpertSet> set = MakeSet();
  env_.inline_cpu = true;  // the worker is idle: nothing was submitted yet
  // Shared with the callback, which outlives this test if it ran on the worker.
  struct Answer {
    std::thread::id thread;
    absl::StatusOr<RunMoeResult> result = absl::UnknownError("not run");
  };
  auto answer = std::make_shared<Answer>();
  ASSERT_TRUE(RunMoe(env_, Request("auto", set), {},
                     [answer](absl::StatusOr<RunMoeResult> result, const MoeRunTiming&) {
                       answer->result = std::move(result);
                       answer->thread = std::this_thread::get_id();
                     })
                  .ok());
  ASSERT_EQ(answer->thread, std::this_thread::get_id());
  absl::StatusOr<RunMoeResult>& got = answer->result;
  ASSERT_TRUE(got.ok()) << got.status();
  env_.inline_cpu = false;
  Outcome queued = Run(Request("auto", set));
  ASSERT_TRUE(queued.result.ok()) << queued.result.status();
  EXPECT_EQ(got->output.output, queued.result->output.output);
  EXPECT_EQ(got->output.topk_ids, queued.result->output.topk_ids);
  EXPECT_EQ(executor_->inline_runs(), 1);
}

// With answer threads, a job run on the worker is answered on one of them:
// an answer that blocks holds neither the worker nor the next call.
TEST_F(RunMoeTest, AQueuedRunIsAnsweredOffTheWorker) {
  TaskPool answers(2, "test-answer");
  env_.answers = &answers;
  std::shared_ptr<const ExpertSet> set = MakeSet();
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  struct Answer {
    bool on_worker = true;
    absl::StatusOr<RunMoeResult> result = absl::UnknownError("not run");
  };
  auto first = std::make_shared<std::promise<Answer>>();
  std::future<Answer> first_out = first->get_future();
  ASSERT_TRUE(RunMoe(env_, Request("auto", set), {},
                     [first, released](absl::StatusOr<RunMoeResult> result, const MoeRunTiming&) {
                       Answer a;
                       a.on_worker = DeviceExecutor::OnWorkerThread();
                       a.result = std::move(result);
                       released.wait();
                       first->set_value(std::move(a));
                     })
                  .ok());
  std::future<Outcome> second = Start(Request("auto", set));
  const std::future_status got = second.wait_for(std::chrono::seconds(10));
  release->set_value();
  ASSERT_EQ(got, std::future_status::ready) << "the second call waited for the first answer";
  Answer a = first_out.get();
  EXPECT_FALSE(a.on_worker);
  ASSERT_TRUE(a.result.ok()) << a.result.status();
  env_.answers = nullptr;  // the worker answers: the same bytes
  Outcome alone = Run(Request("auto", set));
  ASSERT_TRUE(alone.result.ok()) << alone.result.status();
  EXPECT_EQ(a.result->output.output, alone.result->output.output);
  EXPECT_EQ(a.result->output.topk_ids, alone.result->output.topk_ids);
  EXPECT_TRUE(second.get().result.ok());
}

TEST_F(RunMoeTest, EmulationRunsTheCpuReference) {
  Outcome o = Run(Request("emulation"));
  ASSERT_TRUE(o.result.ok()) << o.result.status();
  EXPECT_EQ(o.result->plan.backend, "emulation");
  EXPECT_THAT(o.result->plan.devices, ElementsAre("cpu"));
}

TEST_F(RunMoeTest, ExplicitBackendsThisServerCannotRunAreRefused) {
  // kplan: not executable here (no devices): the oracle's refusal, nested
  // under kernel_config.
  Outcome kplan = Run(Request("kplan"));
  EXPECT_EQ(kplan.result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(kplan.result.status().message()), HasSubstr("emulation"));
  EXPECT_EQ(FieldOf(kplan.result.status()).value_or(""), "kernel_config.moe_backend");
  // kplan_ep runs only on an expert-parallel group.
  env_.executable_backends = {"emulation", "kplan_ep"};
  Outcome ep = Run(Request("kplan_ep"));
  EXPECT_EQ(ep.result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(FieldOf(ep.result.status()).value_or(""), "kernel_config.moe_backend");
}

TEST_F(RunMoeTest, InputErrorsNameTheRequestField) {
  RunMoeRequest r = Request();
  r.input.hidden_shape = {kTokens, kHidden + 1};
  Outcome o = Run(std::move(r));
  EXPECT_EQ(o.result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(FieldOf(o.result.status()).has_value());
}

// Tensors in client CUDA memory (CUDA IPC regions) run only on the GPU
// path: the CPU reference refuses them before anything is queued, naming
// the first reference; the pointers are never touched.
TEST_F(RunMoeTest, CudaTensorsAreRefusedOnTheCpuPath) {
  static char not_device_memory[kTokens * kHidden * 2];
  for (const char* backend : {"auto", "emulation"}) {
    SCOPED_TRACE(backend);
    RunMoeRequest r = Request(backend);
    r.input.hidden_states.clear();
    r.input.device.device = 0;
    r.input.device.hidden_states = not_device_memory;
    r.input.device.hidden_bytes = sizeof(not_device_memory);
    r.input.device.field = "hidden_states.shm";
    Outcome o = Run(std::move(r));
    EXPECT_EQ(o.result.status().code(), absl::StatusCode::kFailedPrecondition) << o.result.status();
    EXPECT_EQ(FieldOf(o.result.status()).value_or(""), "hidden_states.shm");
    EXPECT_THAT(std::string(o.result.status().message()), HasSubstr("CPU reference"));
  }
  // The CPU runner itself refuses too.
  MoeRunInput in = Input();
  in.device.output = not_device_memory;
  in.device.field = "output_shm";
  absl::StatusOr<MoeRunOutput> cpu = RunMoeOnCpu(*MakeSet(), in);
  EXPECT_EQ(cpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(FieldOf(cpu.status()).value_or(""), "output_shm");
}

TEST_F(RunMoeTest, APassedDeadlineDropsTheJobThroughFail) {
  RunMoeCall call;
  call.deadline = absl::Now() - absl::Seconds(1);
  call.cancelled = [] { return false; };
  Outcome o = Run(Request(), std::move(call));
  EXPECT_EQ(o.result.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(RunMoeTest, ACancelledCallIsDropped) {
  RunMoeCall call;
  call.cancelled = [] { return true; };
  Outcome o = Run(Request(), std::move(call));
  EXPECT_EQ(o.result.status().code(), absl::StatusCode::kCancelled);
}

TEST(EpDispatchClassTest, TheOracleRows) {
  EXPECT_EQ(EpDispatchClass(moe::ep::EpStrategy::kAllGatherReduceScatter),
            "MoEPrepareAndFinalizeNaiveDPEPModular");
  EXPECT_EQ(EpDispatchClass(moe::ep::EpStrategy::kAll2AllV), "KplanAll2AllVPrepareAndFinalize");
  EXPECT_EQ(EpDispatchClass(moe::ep::EpStrategy::kPassthrough), "KplanEpPrepareAndFinalize");
}

TEST(ResolveEpStrategyTest, VllmResolutionAndItsErrors) {
  std::unique_ptr<moe::ep::EpRankKind> kind = moe::ep::MakeCpuEpRanks(2);
  const auto resolve = [&](const std::string& moe_backend, const std::string& a2a) {
    ParallelConfig p;
    if (!a2a.empty()) p.all2all_backend = a2a;
    return ResolveEpStrategy(p, moe_backend, *kind);
  };
  struct Ok {
    std::string a2a;
    moe::ep::EpStrategy want;
  };
  for (const Ok& c : {Ok{"", moe::ep::EpStrategy::kAllGatherReduceScatter},
                      Ok{"naive", moe::ep::EpStrategy::kAllGatherReduceScatter},
                      Ok{"allgather_reducescatter", moe::ep::EpStrategy::kAllGatherReduceScatter},
                      Ok{"kplan_all2allv", moe::ep::EpStrategy::kAll2AllV}}) {
    absl::StatusOr<moe::ep::EpStrategy> s = resolve("auto", c.a2a);
    ASSERT_TRUE(s.ok()) << c.a2a << ": " << s.status();
    EXPECT_EQ(*s, c.want) << c.a2a;
  }
  struct Err {
    std::string moe_backend, a2a;
    absl::StatusCode code;
    std::string text;
  };
  for (const Err& c : {
           Err{"auto", "bogus", absl::StatusCode::kInvalidArgument, "literal_error"},
           Err{"auto", "passthrough", absl::StatusCode::kInvalidArgument,
               "only valid with a moe_backend that dispatches"},
           Err{"auto", "deepep_low_latency", absl::StatusCode::kFailedPrecondition,
               "allgather_reducescatter, kplan_all2allv"},
           Err{"kplan_ep", "", absl::StatusCode::kFailedPrecondition,
               "needs the kplan_ep device transport"},
           Err{"kplan_ep", "kplan_all2allv", absl::StatusCode::kInvalidArgument, ""},
       }) {
    SCOPED_TRACE(c.moe_backend + " / " + c.a2a);
    absl::StatusOr<moe::ep::EpStrategy> s = resolve(c.moe_backend, c.a2a);
    EXPECT_EQ(s.status().code(), c.code) << s.status();
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(c.text));
    EXPECT_EQ(FieldOf(s.status()).value_or(""), "parallel.all2all_backend");
  }
}

TEST_F(RunMoeTest, AGroupReportsItsStrategyAndSize) {
  absl::StatusOr<std::unique_ptr<moe::ep::EpGroup>> group =
      moe::ep::EpGroup::Create(moe::ep::MakeCpuEpRanks(2));
  ASSERT_TRUE(group.ok()) << group.status();
  std::shared_ptr<ExpertSet> set = MakeSet();
  std::promise<absl::StatusOr<std::unique_ptr<moe::ep::EpExperts>>> placed;
  ASSERT_TRUE((*group)
                  ->PlaceExperts(set,
                                 [&](absl::StatusOr<std::unique_ptr<moe::ep::EpExperts>> p) {
                                   placed.set_value(std::move(p));
                                 })
                  .ok());
  absl::StatusOr<std::unique_ptr<moe::ep::EpExperts>> ep = placed.get_future().get();
  ASSERT_TRUE(ep.ok()) << ep.status();
  set->AttachDeviceCopy(*std::move(ep));
  env_.ep_group = group->get();

  RunMoeRequest r = Request("auto", set);
  r.parallel.all2all_backend = "kplan_all2allv";
  Outcome o = Run(std::move(r));
  ASSERT_TRUE(o.result.ok()) << o.result.status();
  const MoeExecutionPlan& plan = o.result->plan;
  EXPECT_EQ(plan.backend, "emulation");
  EXPECT_EQ(plan.experts_kernel, "KplanCpuReferenceExperts");
  EXPECT_EQ(plan.dispatch, "KplanAll2AllVPrepareAndFinalize");
  EXPECT_EQ(plan.all2all_backend, "kplan_all2allv");
  EXPECT_EQ(plan.ep_size, 2);
  EXPECT_EQ(plan.devices.size(), 2u);
  EXPECT_TRUE(plan.candidates.empty());
  EXPECT_EQ(o.result->output.num_tokens, kTokens);

  // A strategy error returns before anything is queued.
  RunMoeRequest bad = Request("auto", set);
  bad.parallel.all2all_backend = "deepep_low_latency";
  Outcome refused = Run(std::move(bad));
  EXPECT_EQ(refused.result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(FieldOf(refused.result.status()).value_or(""), "parallel.all2all_backend");
  env_.ep_group = nullptr;
}

}  // namespace
}  // namespace kplan
