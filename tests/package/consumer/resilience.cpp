// Links the installed commgrid::resilience (find_package(commgrid COMPONENTS resilience)):
// the umbrella header declares the driver, the state provider, Recovery and the store keys;
// an epoch's decision written and read back through them.
#include <commgrid/commgrid.hpp>

#include <iostream>

using commgrid::make_recovery;
using commgrid::ResilientCallbacks;
using commgrid::ResilientDriver;
using commgrid::ResilientOptions;
using commgrid::StateProvider;

int main() {
  commgrid::DecisionRecord d;
  d.epoch = 1;
  d.dead = {2};
  d.process_of = {0, 1, 4, 3};
  auto store = commgrid::make_memory_store();
  const std::string text = commgrid::format_decision(d);
  store->set(commgrid::epoch_decision_key(commgrid::kResiliencePrefix, 1),
             std::span<const char>(text.data(), text.size()));
  const auto read = commgrid::read_decisions(*store, commgrid::kResiliencePrefix);
  if (read.size() != 1 || read[0].process_of != d.process_of) {
    std::cerr << "consumer_resilience: the decision did not read back\n";
    return 1;
  }
  std::cout << "consumer_resilience: ok\n";
  return 0;
}
