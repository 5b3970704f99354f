#include <gtest/gtest.h>
TEST(MoeCpu, Placeholder) {}
