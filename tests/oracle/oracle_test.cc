#include "server/oracle/moe_config.h"
#include "gtest/gtest.h"
namespace kplan { namespace { TEST(X, Z) {} } }
