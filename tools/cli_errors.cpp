#include "cli_errors.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <iostream>
#include <optional>
#include <vector>

#include "commgrid/error.hpp"

namespace commgrid::cli {
namespace {

// Edit distance with adjacent transpositions (optimal string alignment): "sise" -> "size"
// is 1, "wrold" -> "world" is 1.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

bool looks_like_flag(std::string_view t) {
  // "-1" and "-.5" are values (a negative rank offset); "-n" and "--tp" are flags.
  if (t.size() < 2 || t[0] != '-') return false;
  return t[1] == '-' ? t.size() > 2 : (std::isalpha(static_cast<unsigned char>(t[1])) != 0);
}

const CLI::Option* find_option(const CLI::App& app, const std::string& name) {
  for (const CLI::Option* o : app.get_options())
    if (o->nonpositional() && o->check_name(name)) return o;
  return nullptr;
}

std::vector<std::string> option_names(const CLI::App& app, bool long_names) {
  std::vector<std::string> out;
  for (const CLI::Option* o : app.get_options()) {
    if (!o->nonpositional() || o->get_group().empty()) continue;  // hidden: never suggested
    for (const std::string& n : long_names ? o->get_lnames() : o->get_snames())
      out.push_back((long_names ? "--" : "-") + n);
  }
  return out;
}

bool has_positionals(const CLI::App& app) {
  for (const CLI::Option* o : app.get_options())
    if (!o->nonpositional()) return true;
  return false;
}

// What is wrong with the arguments of one (sub)command, found by reading them the way
// CLI11 does: the first unknown flag or flag without its value, else the first stray word.
struct Finding {
  std::string problem;  // "" when nothing was found
  const CLI::App* app = nullptr;
  std::string path;  // "commgrid plan"
};

Finding scan(const CLI::App& root, int argc, const char* const* argv, std::string_view program) {
  Finding f{"", &root, std::string(program)};
  std::string stray, program_word;
  const CLI::App* app = &root;
  for (int i = 1; i < argc; ++i) {
    const std::string t = argv[i];
    if (t == "--") break;  // the rest is a program's command line (launch)
    if (!looks_like_flag(t)) {
      bool sub = false;
      for (const CLI::App* s : app->get_subcommands([](const CLI::App*) { return true; }))
        if (s->check_name(t)) {
          app = s;
          f.app = s;
          f.path += " " + s->get_name();
          sub = true;
          break;
        }
      if (sub) continue;
      if (has_positionals(*app)) {  // launch's PROGRAM
        if (program_word.empty()) program_word = t;
        continue;
      }
      if (stray.empty()) stray = "unexpected argument \"" + t + "\"";
      continue;
    }
    const bool is_long = t[1] == '-';
    const std::size_t eq = t.find('=');
    const std::string name = is_long ? t.substr(0, eq) : t.substr(0, 2);
    const bool attached = is_long ? eq != std::string::npos : t.size() > 2;
    const CLI::Option* opt = find_option(*app, name);
    if (opt == nullptr) {
      std::string s = "unknown flag " + name;
      if (!program_word.empty()) {
        // launch -n 2 python3 train.py --lr 1: the program's flags were read as launch's.
        f.problem = s + " after the program \"" + program_word + "\": put -- before the program (" +
                    f.path + " ... -- PROGRAM ARGS...)";
        return f;
      }
      const std::vector<std::string> names = option_names(*app, is_long);
      std::string near = closest_name(name, names, false);
      std::string elsewhere;
      // Right flag, wrong subcommand: name the one that has it.
      for (const CLI::App* other : root.get_subcommands([](const CLI::App*) { return true; }))
        if (other != app && find_option(*other, name) != nullptr) {
          elsewhere = std::string(program) + " " + other->get_name();
          break;
        }
      if (near.empty() && elsewhere.empty()) near = closest_name(name, names, true);
      if (!near.empty()) s += " (did you mean " + near + "?)";
      else if (!elsewhere.empty()) s += " (a flag of " + elsewhere + ")";
      f.problem = std::move(s);
      return f;
    }
    if (opt->get_type_size() == 0 || attached) continue;  // a switch, or --name=VALUE
    if (i + 1 >= argc || std::string_view(argv[i + 1]) == "--") {
      f.problem = name + " needs a value";
      return f;
    }
    if (looks_like_flag(argv[i + 1])) {
      f.problem = name + " needs a value (got the flag " + std::string(argv[i + 1]) + " instead)";
      return f;
    }
    ++i;
  }
  f.problem = stray;
  return f;
}

}  // namespace

std::string closest_name(std::string_view word, const std::vector<std::string>& candidates,
                         bool allow_prefix) {
  auto bare = [](std::string_view s) {
    while (!s.empty() && s.front() == '-') s.remove_prefix(1);
    return s;
  };
  const std::string_view w = bare(word);
  if (w.empty()) return "";
  std::string best;
  std::size_t best_d = SIZE_MAX;
  std::vector<std::string> extensions;  // candidates that w begins
  for (const std::string& c : candidates) {
    const std::string_view b = bare(c);
    if (b.size() > w.size() && b.substr(0, w.size()) == w) extensions.push_back(c);
    const std::size_t d = edit_distance(w, b);
    if (d < best_d || (d == best_d && c < best)) {
      best_d = d;
      best = c;
    }
  }
  // A typo changes about one letter in four; a short word may differ in one.
  const std::size_t limit = std::max<std::size_t>(1, (w.size() + 1) / 4);
  if (best_d <= limit) return best;
  if (allow_prefix && extensions.size() == 1 && w.size() >= 3) return extensions.front();
  return "";
}

void print_error(std::string_view text) {
  std::string line = "error: ";
  line.append(text);
  for (char& c : line)
    if (c == '\n' || c == '\r') c = ' ';
  while (line.size() > 7 && line.back() == ' ') line.pop_back();
  line += '\n';
  std::cout.flush();
  std::fflush(stdout);
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr is gone: nothing else can report it
    done += static_cast<std::size_t>(n);
  }
}

int exit_code_of(const std::exception_ptr& error) noexcept {
  try {
    std::rethrow_exception(error);
  } catch (const ConfigError&) { return 2; } catch (...) {
    return 1;
  }
}

int report_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) { print_error(e.what()); } catch (const std::exception& e) {
    print_error(std::string("internal: ") + e.what());
  } catch (...) { print_error("internal: an unknown exception"); }
  return exit_code_of(error);
}

std::string explain_parse_error(const CLI::App& root, const CLI::ParseError& error, int argc,
                                const char* const* argv, std::string_view program) {
  const Finding f = scan(root, argc, argv, program);
  const std::string help = "see " + f.path + " --help";
  // "plan: ...", "bench layout: ..." for a subcommand; the program's name needs no repeating.
  const std::string who = f.app == &root ? "" : f.path.substr(program.size() + 1) + ": ";
  if (!f.problem.empty()) return who + f.problem + "; " + help;
  std::string what = error.what();
  while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
  return who + what + "; " + help;
}

}  // namespace commgrid::cli
