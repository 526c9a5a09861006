// commgrid: plan, verify and benchmark the communication groups of parallel training.
#include <CLI/CLI.hpp>

#include <cctype>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "cli_errors.hpp"
#include "command.hpp"
#include "commgrid/backends.hpp"
#include "commgrid/communicator.hpp"
#include "commgrid/error.hpp"

namespace {

// "commgrid bench layout" for a subcommand's app.
std::string command_path(const CLI::App& app) {
  std::string path;
  for (const CLI::App* a = &app; a != nullptr; a = a->get_parent())
    path = (a->get_parent() == nullptr ? std::string("commgrid") : a->get_name()) +
           (path.empty() ? "" : " " + path);
  return path;
}

// Empty values are errors like any other bad value: `--timeout ''` never means "default";
// neither is "--" a value (`launch -n -- PROGRAM`: CLI11 hands it to -n). Positional
// arguments (a launched program's arguments) may be empty.
void reject_empty_values(const CLI::App& app) {
  for (const CLI::Option* o : app.get_options()) {
    if (!o->nonpositional() || o->get_type_size() == 0 || o->count() == 0) continue;
    for (const std::string& v : o->results()) {
      if (v.empty())
        throw commgrid::InvalidValueError(
            o->get_name(), app.get_name() + ": " + o->get_name() +
                               " needs a value, got an empty one (omit the flag for the default)");
      if (v == "--")
        throw commgrid::InvalidValueError(o->get_name(), app.get_name() + ": " + o->get_name() +
                                                             " needs a value; see " +
                                                             command_path(app) + " --help");
    }
  }
  for (const CLI::App* sub : app.get_subcommands()) reject_empty_values(*sub);
}

// CLI11 words its messages as sentences ("A subcommand is required", "--tp: At Most 1
// required but received 2"); every error line of commgrid starts lower-case. A missing
// subcommand also names the valid ones.
CLI::ParseError lower_case(const CLI::App& app, const CLI::ParseError& e) {
  std::string m = e.what();
  const CLI::App* chosen = &app;
  for (bool deeper = true; deeper;) {
    deeper = false;
    for (const CLI::App* sub : chosen->get_subcommands())
      if (sub->parsed()) {
        chosen = sub;
        deeper = true;
        break;
      }
  }
  if (m.starts_with("A subcommand is required")) {
    std::string valid;
    for (const CLI::App* sub : chosen->get_subcommands([](const CLI::App*) { return true; }))
      valid += (valid.empty() ? "" : ", ") + sub->get_name();
    m = "a subcommand is required (valid: " + valid + ")";
  }
  // A capital that starts a word of CLI11's text, not an acronym ("INI") or a name.
  const auto lower_at = [&](std::size_t i) {
    if (i + 1 < m.size() && std::isupper(static_cast<unsigned char>(m[i])) &&
        std::islower(static_cast<unsigned char>(m[i + 1])))
      m[i] = static_cast<char>(std::tolower(static_cast<unsigned char>(m[i])));
  };
  lower_at(0);
  if (const std::size_t colon = m.find(": "); colon != std::string::npos) lower_at(colon + 2);
  for (const char* word : {" Most ", " Least "})
    if (const std::size_t at = m.find(word); at != std::string::npos) lower_at(at + 1);
  return CLI::ParseError(m, e.get_exit_code());
}

// "commgrid 0.1.0 (backends: gloo, mpi)": what `--version` prints.
std::string version_text() {
  std::string backends;
  auto add = [&](bool has, const char* name) {
    if (has) backends += (backends.empty() ? "" : ", ") + std::string(name);
  };
  add(COMMGRID_HAS_GLOO, "gloo");
  add(COMMGRID_HAS_MPI, "mpi");
  add(COMMGRID_HAS_NCCL, "nccl");
  return std::string("commgrid ") + COMMGRID_VERSION +
         " (backends: " + (backends.empty() ? "none" : backends) + ")";
}

int run(int argc, char** argv) {
  using namespace commgrid;
  CLI::App app{
      "commgrid: lay out, create and verify the communication groups of "
      "N-dimensional parallel training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text(), "print the version and the backends built in");
  std::vector<cli::Command> commands;
  commands.push_back(cli::add_plan_command(app));
  commands.push_back(cli::add_verify_command(app));
  commands.push_back(cli::add_launch_command(app));
  commands.push_back(cli::add_bench_command(app));

  try {
    // CLI11 reports an unknown first word as "a subcommand is required"; name it instead.
    std::string valid;
    std::vector<std::string> names;
    bool known = false;
    for (const auto& c : commands) {
      valid += (valid.empty() ? "" : ", ") + c.app->get_name();
      names.push_back(c.app->get_name());
      known = known || (argc > 1 && c.app->get_name() == argv[1]);
    }
    if (argc > 1 && argv[1][0] != '-' && !known) {
      const std::string near = cli::closest_name(argv[1], names);
      cli::print_error("unknown command \"" + std::string(argv[1]) + "\"" +
                       (near.empty() ? "" : " (did you mean " + near + "?)") + " (valid: " + valid +
                       "); see commgrid --help");
      return 2;
    }
    app.parse(argc, argv);
    reject_empty_values(app);
    for (auto& c : commands)
      if (c.app->parsed()) return c.run();
    cli::print_error("no subcommand given; see commgrid --help");
    return 2;
  } catch (const CLI::Success& e) {  // --help and friends: CLI11 prints, exit 0
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    cli::print_error(cli::explain_parse_error(app, lower_case(app, e), argc, argv, "commgrid"));
    return 2;
  } catch (...) {  // ConfigError: 2, any other failure: 1
    return cli::report_error(std::current_exception());
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (...) {
    // (run catches every error of the command; this is for what escapes its handlers.)
    try {
      return commgrid::cli::report_error(std::current_exception());
    } catch (...) { return 1; }
  }
}
