#include <gtest/gtest.h>
TEST(Spec, P2) {}
