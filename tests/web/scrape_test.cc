// The web endpoint against the real consumers, with a real job: a ring-coord process with --http,
// `ringctl run` of the tiny spec (ringd and two CPU workers), then
//  - Debian's `prometheus` scraping /metrics with the token (credentials_file) until its HTTP
//    API returns the job's step and loss series with the coordinator's numbers;
//  - Debian's `chromium`, headless, opening the dashboard: the DOM has the job, its loss curve
//    with one point per step and a straggler finding (inserted as a `straggler` event), and a
//    screenshot is saved under the build tree (tests/web/artifacts/dashboard.png).
// Each skips with the reason when its program is not installed (scripts/install-deps.sh installs
// both).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "coord_with_job.h"
#include "coordinator/store.h"
#include "tests/common/run.h"
#include "tests/common/test_proc.h"
#include "web_util.h"

using namespace ring::web_test;
using nlohmann::json;
using ring::test::Proc;
using ring::test::slurp;

TEST(WebScrape, PrometheusScrapesTheJobsStepAndLoss) {
  if (::access("/usr/bin/prometheus", X_OK) != 0)
    GTEST_SKIP() << "/usr/bin/prometheus is not installed (Debian package prometheus; "
                    "scripts/install-deps.sh installs it)";
  CoordWithJob c("token");
  ASSERT_FALSE(c.url.empty()) << c.log();
  ASSERT_EQ(c.run_exit, 0) << c.run_output;
  // The coordinator's final numbers, from its database (read-only).
  std::optional<double> loss;
  ASSERT_TRUE(wait_until(30, [&] {
    ring::coord::Store st(c.state + "/coord.db", {true, 0, true});
    auto j = st.job(1);
    loss = j ? j->last_loss : std::nullopt;
    return j && j->last_step == 6;
  }));
  ASSERT_TRUE(loss);

  // Prometheus scrapes /metrics every second with the token from the state directory.
  const std::string pdir = c.dir.path + "/prometheus";
  std::filesystem::create_directories(pdir);
  std::ofstream(pdir + "/prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
      << "scrape_configs:\n  - job_name: ring-coord\n    metrics_path: /metrics\n"
      << "    authorization:\n      type: Bearer\n      credentials_file: " << c.state
      << "/http.token\n"
      << "    static_configs:\n      - targets: ['" << c.url.substr(7, c.url.size() - 8) << "']\n";
  std::unique_ptr<Proc> prom;
  int port = 0;
  // A port picked free may be taken before Prometheus binds it: try a few.
  for (int attempt = 0; attempt < 5 && !prom; ++attempt) {
    port = free_port();
    auto p = std::make_unique<Proc>(
        std::vector<std::string>{"/usr/bin/prometheus", "--config.file=" + pdir + "/prometheus.yml",
                                 "--storage.tsdb.path=" + pdir + "/tsdb",
                                 "--web.listen-address=127.0.0.1:" + std::to_string(port)},
        pdir + "/log", pdir + "/log");
    bool up =
        wait_until(60, [&] { return http(port, "GET", "/-/ready").status == 200 || p->poll(); });
    if (up && p->pid > 0) prom = std::move(p);
  }
  ASSERT_TRUE(prom) << slurp(pdir + "/log");

  auto query = [&](const std::string& q) {
    auto r = http(port, "GET", "/api/v1/query?query=" + url_encode(q));
    json j = json::parse(r.body, nullptr, false);
    return j.is_object() && j.value("status", "") == "success" ? j["data"]["result"]
                                                               : json::array();
  };
  json step, loss_series;
  bool seen = wait_until(90, [&] {
    step = query("ring_job_step{job_id=\"1\"}");
    loss_series = query("ring_job_loss{job_id=\"1\"}");
    return step.size() == 1 && step[0]["value"][1] == "6" && loss_series.size() == 1;
  });
  ASSERT_TRUE(seen) << step.dump() << loss_series.dump() << "\n"
                    << slurp(pdir + "/log").substr(0, 4000);
  EXPECT_EQ(step[0]["metric"]["job_id"], "1");
  EXPECT_EQ(step[0]["metric"]["instance"], c.url.substr(7, c.url.size() - 8));
  // The loss Prometheus stored is the coordinator's, to the last bit.
  EXPECT_EQ(std::stod(loss_series[0]["value"][1].get<std::string>()), *loss);
  // The target is healthy: it scraped with the token.
  auto up = query("up{job=\"ring-coord\"}");
  ASSERT_EQ(up.size(), 1u);
  EXPECT_EQ(up[0]["value"][1], "1");
  // Jobs by state: the run completed.
  auto done = query("ring_jobs{state=\"completed\"}");
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]["value"][1], "1");
}

TEST(WebBrowser, DashboardShowsTheJobItsLossCurveAndAStraggler) {
  if (::access("/usr/bin/chromium", X_OK) != 0)
    GTEST_SKIP() << "/usr/bin/chromium is not installed (Debian package chromium; "
                    "scripts/install-deps.sh installs it)";
  CoordWithJob c("none");
  ASSERT_FALSE(c.url.empty()) << c.log();
  ASSERT_EQ(c.run_exit, 0) << c.run_output;
  std::string node;
  {
    // The finding the straggler detector would record, and per-rank timings of the last step,
    // written beside the running coordinator (WAL: one writer at a time, with a busy timeout).
    ring::coord::Store st(c.state + "/coord.db", {false, 0, false});
    ASSERT_TRUE(wait_until(30, [&] { return st.job(1) && st.job(1)->last_step == 6; }));
    auto steps = st.steps(1, 5, 10);
    ASSERT_FALSE(steps.empty());
    node = steps.back().node;
    ring::coord::Txn t(st.db());
    for (int rank = 0; rank < 2; ++rank)
      st.db()
          .prepare(
              "INSERT OR REPLACE INTO rank_steps(job_id, attempt, step, rank, node, step_time_s, "
              "data_s, compute_s, wait_s, comm_s, hop_bytes, time) VALUES "
              "(1,1,6,?,?,?,?,?,?,?,?,?)")
          .args(int64_t{rank}, node, rank ? 0.05 : 0.02, 0.001, rank ? 0.045 : 0.01,
                rank ? 0.001 : 0.008, 0.003, int64_t{65536}, ring::coord::now_unix())
          .run();
    st.add_event(1, 1, node, "straggler",
                 {{"rank", 1},
                  {"node", node},
                  {"step", 6},
                  {"steps", 5},
                  {"behind_s", 0.03},
                  {"message", "rank 1 arrived last in 5 of the last 5 steps"}});
    t.commit();
  }
  const std::string page = c.url + "jobs/1";
  const std::string profile = c.dir.path + "/chromium";
  auto chromium = [&](const std::vector<std::string>& extra, const std::string& out) {
    std::vector<std::string> args{"/usr/bin/chromium",      "--headless",
                                  "--no-sandbox",           "--disable-gpu",
                                  "--no-first-run",         "--user-data-dir=" + profile,
                                  "--window-size=1280,1800"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back(page);
    Proc p(args, out, c.dir.path + "/chromium.err",
           ring::test::ProcOptions{{{"HOME", c.dir.path}}, {}, true});
    return p.wait(60);
  };
  ASSERT_EQ(chromium({"--dump-dom"}, c.dir.path + "/dom.html"), 0)
      << slurp(c.dir.path + "/chromium.err");
  std::string dom = slurp(c.dir.path + "/dom.html");
  EXPECT_NE(dom.find("id=\"job\" data-job=\"1\""), std::string::npos) << dom.substr(0, 3000);
  EXPECT_NE(dom.find("run-tiny"), std::string::npos);
  // The loss curve: one point per step, as a polyline of 6 coordinates and 6 circles.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      dom, m, std::regex("data-series=\"loss\" data-points=\"(\\d+)\"[^>]*points=\"([^\"]*)\"")))
      << dom.substr(0, 3000);
  EXPECT_EQ(m[1], "6");
  std::string pts = m[2];
  EXPECT_EQ(std::count(pts.begin(), pts.end(), ','), 6) << pts;
  // The straggler finding, with its rank and node.
  EXPECT_NE(dom.find("class=\"finding straggler\" data-rank=\"1\""), std::string::npos);
  EXPECT_NE(dom.find("Straggler: rank 1 on " + node), std::string::npos);
  EXPECT_NE(dom.find("rank 1 arrived last in 5 of the last 5 steps"), std::string::npos);
  // The phase view of step 6 and the checkpoints the run wrote.
  EXPECT_NE(dom.find("step 6: phases per rank"), std::string::npos);
  EXPECT_NE(dom.find("id=\"checkpoints\""), std::string::npos);

  // The screenshot, kept under the build tree as the test's artifact.
  const std::string art = kBin + "/tests/web/artifacts";
  std::filesystem::create_directories(art);
  std::filesystem::remove(art + "/dashboard.png");
  ASSERT_EQ(chromium({"--screenshot=" + art + "/dashboard.png", "--hide-scrollbars"},
                     c.dir.path + "/shot.out"),
            0)
      << slurp(c.dir.path + "/chromium.err");
  std::string png = slurp(art + "/dashboard.png");
  ASSERT_GT(png.size(), 1000u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}
