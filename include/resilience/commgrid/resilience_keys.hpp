// The store keys of resilience, and the signal launch sends, spelled once: every key a
// recovering job reads or writes (the processes' Recovery, commgrid launch posting deaths
// and following the epochs, the tests) comes from these functions, and each epoch's
// decision is written and read by format_decision / parse_decision. docs/resilience.md,
// "The store's keys".
#pragma once

#include <csignal>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "commgrid/store.hpp"

namespace commgrid {

/// The prefix every key of resilience lives under unless RecoveryOptions::prefix says
/// otherwise.
inline constexpr std::string_view kResiliencePrefix = "resilience";

/// The signal commgrid launch --spares sends its other processes, with the failed epoch as
/// the value (sigqueue), once it has posted a death. Ignored by default; commgrid.torch's
/// driver ends that epoch's connections on it (python/src/epoch_sockets.hpp).
inline constexpr int kEpochFailureSignal = SIGURG;

/// "<prefix>/process/<p>/<incarnation>/dead": the death of one incarnation of a process
/// (posted by commgrid launch when it exits, or by the decider that declares it dead).
[[nodiscard]] std::string dead_process_key(std::string_view prefix, std::int64_t process,
                                           int incarnation);
/// "<prefix>/epoch/<e>/failed": epoch e failed; its value is the first reason given.
[[nodiscard]] std::string epoch_failed_key(std::string_view prefix, std::int64_t epoch);
/// "<prefix>/epoch/<e>/decision": the decision that starts epoch e (format_decision).
[[nodiscard]] std::string epoch_decision_key(std::string_view prefix, std::int64_t epoch);
/// "<prefix>/epoch/<e>/alive/<p>": process p registered for epoch e; its value is a
/// registration (format_registration).
[[nodiscard]] std::string epoch_alive_key(std::string_view prefix, std::int64_t epoch,
                                          std::int64_t process);
/// "<prefix>/epoch/<e>/world": the store prefix of epoch e's world and groups.
[[nodiscard]] std::string epoch_world_prefix(std::string_view prefix, std::int64_t epoch);
/// "<prefix>/epoch/<e>/reshard": the store prefix of the transfer world of a shrink into
/// epoch e (every live process).
[[nodiscard]] std::string epoch_transfer_prefix(std::string_view prefix, std::int64_t epoch);
/// "<prefix>/epoch/<e>/torch_store": the address ("host:port") of the torch TCPStore that
/// epoch e's logical rank 0 serves for a Python program's torch groups
/// (commgrid.torch.ResilientDriver).
[[nodiscard]] std::string epoch_torch_store_key(std::string_view prefix, std::int64_t epoch);
/// "<prefix>/done": the job finished (logical rank 0 sets it after the last step).
[[nodiscard]] std::string job_done_key(std::string_view prefix);
/// "<prefix>/ended": the job cannot go on (no spare and no smaller layout, a state lost,
/// a state provider that failed); its value is the one line that says why.
[[nodiscard]] std::string job_ended_key(std::string_view prefix);
/// "process/<p>/<incarnation>": the identity a process gives its store connection
/// (StoreOptions::process), which a decision that declares it dead fences.
[[nodiscard]] std::string process_identity(std::int64_t process, int incarnation);

/// One epoch's decision, as stored under epoch_decision_key:
///
///     epoch=2
///     decider=0
///     dead=3
///     revived=1:1
///     shrink=4          (only when the world shrank: its new size)
///     ranks=0,5,2,4     (the process of each logical rank of the new epoch)
///     fingerprint=9f...  (only when every process registered with the same one)
///     notes=0/1,2 3/4    (the processes' notes, process/note, space-separated)
///
/// A decision after which the job cannot go on (no spare and no smaller layout) has no
/// ranks line; job_ended_key then says why.
struct DecisionRecord {
  std::int64_t epoch = 0;
  std::int64_t decider = -1;
  std::vector<std::int64_t> dead;                     ///< processes declared dead
  std::vector<std::pair<std::int64_t, int>> revived;  ///< (process, incarnation) back as spares
  std::optional<std::int64_t> shrink_world;           ///< the new world size of a shrink
  std::vector<std::int64_t> process_of;               ///< per logical rank; empty: no epoch
  /// With kept connections: the pairs of processes to make anew (an end of either held an
  /// unfinished operation), each (lower, higher).
  std::vector<std::pair<std::int64_t, std::int64_t>> renew;
  /// The fingerprint of layout and options (ProcessGroups::fingerprint) that every process
  /// the decision counts on registered with (Recovery::declare); absent when one did not
  /// declare, two differ, or the decision shrinks or revives.
  std::optional<std::uint64_t> fingerprint;
  /// The processes' notes (Recovery::set_note), by process.
  std::map<std::int64_t, std::string> notes;
};
/// A registration, as stored under epoch_alive_key: "incarnation", and when any of the
/// rest is set ";" the processes whose pairs with this one must be made anew (kept
/// connections; comma-separated, may be empty), ";" the declared fingerprint (hex, may be
/// empty) and, with a note, ";" the note ("0", "0;3,5;", "1;;9f...;4,-1,0").
struct RegistrationRecord {
  std::int64_t incarnation = 0;
  std::vector<std::int64_t> renew;
  std::optional<std::uint64_t> fingerprint;  ///< Recovery::declare's
  std::string note;                          ///< Recovery::set_note's
};
[[nodiscard]] std::string format_registration(const RegistrationRecord& registration);
/// Parses a stored registration; BackendError naming the malformed part.
[[nodiscard]] RegistrationRecord parse_registration(std::string_view text);

/// Numbers as a stored list: "3,-1,5" ("" for none).
[[nodiscard]] std::string join_numbers(const std::vector<std::int64_t>& numbers);
/// The numbers of a stored list; BackendError "recovery: malformed <what> '<item>'".
[[nodiscard]] std::vector<std::int64_t> parse_numbers(std::string_view text, std::string_view what);

/// A fingerprint as stored: 16 lower-case hex digits.
[[nodiscard]] std::string fingerprint_text(std::uint64_t fingerprint);
/// The fingerprint of a stored text; nullopt when it is not 1 to 16 hex digits.
[[nodiscard]] std::optional<std::uint64_t> parse_fingerprint(std::string_view text);
/// The stored text of a decision (the format above; empty lists are written empty).
[[nodiscard]] std::string format_decision(const DecisionRecord& decision);
/// Parses a stored decision. Lines it does not know are ignored (a later format may add
/// some). Throws BackendError naming the line for a malformed one.
[[nodiscard]] DecisionRecord parse_decision(std::string_view text);

/// The decisions in `store` under `prefix` from epoch `from` + 1 on, in order, as long as
/// they follow one another (epoch e's decision exists for each): what commgrid launch reads
/// to follow the job (which process holds logical rank 0 now: back().process_of[0]).
[[nodiscard]] std::vector<DecisionRecord> read_decisions(Store& store, std::string_view prefix,
                                                         std::int64_t from = 0);
/// Why the job ended (job_ended_key's value), or nullopt while it goes on.
[[nodiscard]] std::optional<std::string> job_end_reason(Store& store, std::string_view prefix);

}  // namespace commgrid
