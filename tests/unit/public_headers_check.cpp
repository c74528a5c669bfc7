// Built, not run: the public headers compile without a warning under -Wall -Wextra -Werror, so a
// program that adds torchpilot with add_subdirectory and builds with -Wextra gets none from them
// (tests/CMakeLists.txt). StepScope and PhaseScope are [[nodiscard]]: `pilot.step(n);` alone
// would be diagnosed (not checked here: it would not compile).
#include "torchpilot/torchpilot.h"
