// Names and text through the whole agent to ampscope-server (real process on loopback): a
// Unicode tensor name is stored as written; a name, notice or run metadata that is not clean
// text (invalid UTF-8, a control character, over the limit) is sent escaped as docs/agent.md
// says, said once in a notice, and costs no report.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "ampscope/agent/agent.h"
#include "ampscope/agent/config.h"
#include "ampscope/testing/files.h"
#include "ampscope/testing/server_process.h"
#include "ampscope/text.h"
#include "fake_step.h"
#include "server_harness.h"
#include "spool_reader.h"

namespace ampscope::agent {
namespace {

using namespace std::chrono_literals;
using ampscope::testing::TempDir;
using testing::base_config;
using testing::make_step_tensors;
using testing::view_of;

constexpr const char* kUnicode = "encoder.temp\xc3\xa9rature.\xe7\xba\xbf\xe6\x80\xa7";
// Invalid UTF-8 (a lone FF, a surrogate's bytes), a backslash, and an escape character.
constexpr const char* kInvalid = "bad\xff.\xed\xa0\x80.a\\b\x1b[2J";
constexpr const char* kInvalidSent = "bad\\xff.\\xed\\xa0\\x80.a\\x5cb\\x1b[2J";

bool contains(const google::protobuf::RepeatedPtrField<std::string>& list, const std::string& s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

TEST(AgentNamesTest, UnicodeIsStoredAsWrittenAndAnythingElseEscapedWithoutLosingAStep) {
  TempDir dir;
  ampscope::testing::ServerProcess server(dir.path(), dir / "store.db");
  AgentConfig c = base_config(dir, "names");
  c.server = server.address();
  c.flush_timeout = 20s;
  ASSERT_EQ(set_option(c, "sample_count_roles", "activation,activation_grad,weight_grad,loss"), "");
  const std::string long_name = std::string(250, 'w') + "\xe7\xba\xbf.grad";
  {
    RunInfo run;
    run.trainer = "trainer\x01v2";
    run.precision = "amp-fp16";
    run.host = "h\xc3\xb4te-\xe4\xb8\x80";
    std::unique_ptr<Agent> agent;
    ASSERT_TRUE(Agent::create(c, run, &agent).ok());
    ASSERT_TRUE(agent->add_notice("trainer: caf\xc3\xa9 \xc3").ok());
    for (int step = 0; step < 3; ++step) {
      auto tensors = make_step_tensors();
      tensors[2].name = kUnicode;                  // activation
      tensors[4].name = kInvalid;                  // activation gradient
      tensors[6].name = long_name;                 // weight gradient, 259 bytes
      if (step == 1) tensors[4].fp16[7] = 0x7e00;  // a NaN: the first offender
      ASSERT_TRUE(agent->begin_step(step));
      int order = 0;
      for (const auto& t : tensors) ASSERT_TRUE(agent->observe(view_of(t, order++, 1024)).ok());
      StepInfo info;
      info.step = step;
      info.found_inf = info.skipped = step == 1;
      info.loss = 2.0;
      info.loss_scale = info.scale_after = 1024;
      info.lr = 1e-3;
      agent->end_step(info);
    }
  }  // the agent's shutdown waits for the server's Acks

  const auto stored = ampscope::testing::stored_reports(server.address(), "names");
  ASSERT_EQ(stored.size(), 3u) << "a name cost a report";
  const std::string long_sent = text::clean_text(long_name, text::kNameMaxBytes);
  EXPECT_LE(long_sent.size(), 256u);
  EXPECT_EQ(long_sent, std::string(247, 'w') + "~" + long_sent.substr(248));
  for (const auto& r : stored) {
    std::vector<std::string> names;
    for (const auto& t : r.tensors()) names.push_back(t.name());
    EXPECT_NE(std::find(names.begin(), names.end(), kUnicode), names.end()) << r.step();
    EXPECT_NE(std::find(names.begin(), names.end(), kInvalidSent), names.end()) << r.step();
    EXPECT_NE(std::find(names.begin(), names.end(), long_sent), names.end()) << r.step();
  }
  ASSERT_TRUE(stored[1].has_first_offender());
  EXPECT_EQ(stored[1].first_offender().tensor(), kInvalidSent);

  const auto info = ampscope::testing::get_run(server.address(), "names");
  ASSERT_TRUE(info.has_value());
  ASSERT_EQ(info->agents_size(), 1);
  const v1::AgentInfo& a = info->agents(0);
  EXPECT_EQ(a.host(), "h\xc3\xb4te-\xe4\xb8\x80");
  EXPECT_EQ(a.trainer(), "trainer\\x01v2");
  EXPECT_TRUE(contains(a.notices(), "trainer: caf\xc3\xa9 \\xc3"));
  // Said once, naming the first escaped name as sent.
  int escaped_notices = 0;
  for (const auto& n : a.notices()) {
    if (n.find("sent escaped") != std::string::npos) {
      ++escaped_notices;
      EXPECT_NE(n.find(kInvalidSent), std::string::npos) << n;
    }
  }
  EXPECT_EQ(escaped_notices, 1);
}

// The C API hands names as bytes: the same rules, through the spool (what would be sent).
TEST(AgentNamesTest, EverySpooledStringIsCleanText) {
  TempDir dir;
  AgentConfig c = base_config(dir, "names-spool");
  ASSERT_EQ(set_option(c, "sample_count_roles", "activation,activation_grad,weight_grad,loss"), "");
  {
    RunInfo run;
    run.trainer = "t";
    std::unique_ptr<Agent> agent;
    ASSERT_TRUE(Agent::create(c, run, &agent).ok());
    ASSERT_TRUE(agent->add_notice(std::string("nul \0 and \x9b", 11)).ok());
    auto tensors = make_step_tensors();
    tensors[1].name = std::string("\x80\xc0\xaf\xf4\x90\x80\x80", 7);
    tensors[3].name = std::string(4096, '\x01');
    ASSERT_TRUE(agent->begin_step(0));
    int order = 0;
    for (const auto& t : tensors) ASSERT_TRUE(agent->observe(view_of(t, order++, 1)).ok());
    StepInfo info;
    info.loss_scale = info.scale_after = 1;
    agent->end_step(info);
  }
  const auto reports = testing::read_spool(dir / "spool", "names-spool");
  ASSERT_EQ(reports.size(), 1u);
  const v1::StepReport& r = reports[0];
  std::vector<std::string> names;
  for (const auto& t : r.tensors()) {
    EXPECT_TRUE(text::is_clean_text(t.name())) << t.name();
    EXPECT_LE(t.name().size(), text::kNameMaxBytes);
    names.push_back(t.name());
  }
  EXPECT_NE(std::find(names.begin(), names.end(), "\\x80\\xc0\\xaf\\xf4\\x90\\x80\\x80"),
            names.end());
  for (const auto& n : r.notices()) EXPECT_TRUE(text::is_clean_text(n)) << n;
  EXPECT_TRUE(contains(r.notices(), "nul \\x00 and \\x9b"));
}

}  // namespace
}  // namespace ampscope::agent
