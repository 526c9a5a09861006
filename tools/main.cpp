// commgrid: plan, verify and benchmark the communication groups of parallel training.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>
#include <vector>

#include "command.hpp"
#include "commgrid/communicator.hpp"
#include "commgrid/error.hpp"

namespace {

// Empty values are errors like any other bad value: `--timeout ''` never means "default".
// Positional arguments (a launched program's arguments) may be empty.
void reject_empty_values(const CLI::App& app) {
  for (const CLI::Option* o : app.get_options()) {
    if (!o->nonpositional() || o->get_type_size() == 0 || o->count() == 0) continue;
    for (const std::string& v : o->results())
      if (v.empty())
        throw commgrid::InvalidValueError(
            o->get_name(), app.get_name() + ": " + o->get_name() +
                               " needs a value, got an empty one (omit the flag for the default)");
  }
  for (const CLI::App* sub : app.get_subcommands()) reject_empty_values(*sub);
}

// Each error is one line written with one write(2), so that a rank stopped right after it
// (by launch, or by its own exit) never leaves half a line.
void print_error(const std::string& text) {
  std::string line = "error: " + commgrid::cli::one_line(text) + "\n";
  std::cout.flush();
  std::cerr << line << std::flush;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace commgrid;
  CLI::App app{"commgrid: lay out, create and verify the communication groups of "
               "N-dimensional parallel training"};
  app.require_subcommand(1);
  std::vector<cli::Command> commands;
  commands.push_back(cli::add_plan_command(app));
  commands.push_back(cli::add_verify_command(app));
  commands.push_back(cli::add_launch_command(app));
  commands.push_back(cli::add_bench_command(app));

  try {
    // CLI11 reports an unknown first word as "a subcommand is required"; name it instead.
    std::string valid;
    bool known = false;
    for (const auto& c : commands) {
      valid += (valid.empty() ? "" : ", ") + c.app->get_name();
      known = known || (argc > 1 && c.app->get_name() == argv[1]);
    }
    if (argc > 1 && argv[1][0] != '-' && !known) {
      std::cerr << "error: unknown command \"" << argv[1] << "\" (valid: " << valid << ")\n";
      return 2;
    }
    app.parse(argc, argv);
    reject_empty_values(app);
    for (auto& c : commands)
      if (c.app->parsed()) return c.run();
    std::cerr << "error: no subcommand given\n";
    return 2;
  } catch (const CLI::Success& e) {  // --help and friends: CLI11 prints, exit 0
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    print_error(e.what());
    return 2;
  } catch (const ConfigError& e) {
    print_error(e.what());
    return 2;
  } catch (const Error& e) {
    print_error(e.what());
    return 1;
  } catch (const std::exception& e) {
    print_error(std::string("internal: ") + e.what());
    return 1;
  }
}
