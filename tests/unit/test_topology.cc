// Which ranks share a node (src/topology.h): numbering, local ranks, the names users
// give, and the launchers' local ranks checked against it.
#include <gtest/gtest.h>

#include "test_util.h"
#include "topology.h"

namespace gradcomm::detail {
namespace {

using testing::ScopedEnv;

TEST(NodeMap, NodesAreNumberedByTheirLowestRankAndKeepRankOrder) {
  const NodeMap map = NodeMap::from_names({"b", "a", "b", "c", "a"});
  ASSERT_EQ(map.nodes(), 3);
  EXPECT_EQ(map.name(0), "b");  // rank 0's node comes first
  EXPECT_EQ(map.members(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(map.members(1), (std::vector<int>{1, 4}));
  EXPECT_EQ(map.members(2), (std::vector<int>{3}));
  EXPECT_EQ(map.local_rank(4), 1);
  EXPECT_EQ(map.local_rank(3), 0);
  EXPECT_TRUE(map.same_node(1, 4));
  EXPECT_FALSE(map.same_node(0, 1));
  EXPECT_EQ(map.largest_node(), 2);
  EXPECT_TRUE(map.two_levels());
  const Topology t = map.view(4);
  EXPECT_EQ(t.nodes, 3);
  EXPECT_EQ(t.node, 1);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.local_size, 2);
  EXPECT_EQ(t.node_name, "a");
  EXPECT_EQ(t.node_of_rank, (std::vector<int>{0, 1, 0, 2, 1}));
}

TEST(NodeMap, TwoLevelsNeedSeveralNodesAndOneWithSeveralRanks) {
  EXPECT_FALSE(NodeMap::single(4).two_levels());                        // one node
  EXPECT_FALSE(NodeMap::from_names({"a", "b", "c"}).two_levels());      // a rank per node
  EXPECT_TRUE(NodeMap::from_names({"a", "a", "a", "b", "b"}).two_levels());  // 3 + 2
  EXPECT_THROW(NodeMap::from_names({}), InvalidArgument);
}

TEST(NodeMap, DescriptionIsBoundedAndDigestTellsLayoutsApart) {
  std::vector<std::string> names;
  for (int r = 0; r < 1024; ++r) names.push_back("node" + std::to_string(r / 8));
  const NodeMap big = NodeMap::from_names(names);
  EXPECT_EQ(big.nodes(), 128);
  const std::string text = big.describe();
  EXPECT_LT(text.size(), 800u) << text;
  EXPECT_NE(text.find("120 more"), std::string::npos) << text;
  EXPECT_NE(NodeMap::from_names({"a", "a", "b", "b"}).digest(), NodeMap::from_names({"a", "b", "a", "b"}).digest());
  EXPECT_EQ(NodeMap::from_names({"x", "x", "y"}).digest(), NodeMap::from_names({"p", "p", "q"}).digest());
}

TEST(NodeMap, NodeNameComesFromTheEnvironmentOrTheHost) {
  {
    ScopedEnv node("GRADCOMM_NODE", "rack3-node7");
    EXPECT_EQ(this_node_name(), "rack3-node7");
    EXPECT_TRUE(node_named_by_user());
  }
  {
    ScopedEnv node("GRADCOMM_NODE", nullptr);
    const std::string host = this_node_name();
    EXPECT_NE(host.find('/'), std::string::npos) << host;  // hostname/boot id
    EXPECT_FALSE(node_named_by_user());
  }
  for (const std::string& bad : {std::string("two words"), std::string("tab\there"), std::string(65, 'x')}) {
    ScopedEnv node("GRADCOMM_NODE", bad.c_str());
    try {
      (void)this_node_name();
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("GRADCOMM_NODE"), std::string::npos) << e.what();
    }
  }
}

TEST(NodeMap, LaunchersLocalRanksMustAgreeUnlessNodesAreNamed) {
  const NodeMap map = NodeMap::from_names({"h", "h", "h", "h"});
  ScopedEnv named("GRADCOMM_NODE", nullptr);
  ScopedEnv world_size("WORLD_SIZE", "4");
  {
    ScopedEnv local("LOCAL_RANK", "2"), local_size("LOCAL_WORLD_SIZE", "4");
    {
      ScopedEnv world_rank("RANK", "2");
      EXPECT_NO_THROW(check_launcher_local_ranks(map, 2));
    }
    ScopedEnv world_rank("RANK", "1");
    try {
      check_launcher_local_ranks(map, 1);
      ADD_FAILURE() << "a wrong LOCAL_RANK was accepted";
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("LOCAL_RANK=2"), std::string::npos) << m;
      EXPECT_NE(m.find("local rank 1 of 4"), std::string::npos) << m;
      EXPECT_NE(m.find("GRADCOMM_NODE"), std::string::npos) << m;
    }
  }
  {
    ScopedEnv local("LOCAL_RANK", "1"), local_size("LOCAL_WORLD_SIZE", "2"), world_rank("RANK", "1");  // two torchruns
    EXPECT_THROW(check_launcher_local_ranks(map, 1), InvalidArgument);
    ScopedEnv node("GRADCOMM_NODE", "n0");  // the user names the nodes: the launcher's hosts do not count
    EXPECT_NO_THROW(check_launcher_local_ranks(map, 1));
  }
  {
    ScopedEnv ompi("OMPI_COMM_WORLD_LOCAL_RANK", "3"), ompi_size("OMPI_COMM_WORLD_LOCAL_SIZE", "4");
    ScopedEnv ompi_world("OMPI_COMM_WORLD_SIZE", "4");
    ScopedEnv local("LOCAL_RANK", nullptr), local_size("LOCAL_WORLD_SIZE", nullptr);
    {
      ScopedEnv ompi_rank("OMPI_COMM_WORLD_RANK", "3");
      EXPECT_NO_THROW(check_launcher_local_ranks(map, 3));
    }
    ScopedEnv ompi_rank("OMPI_COMM_WORLD_RANK", "0");
    EXPECT_THROW(check_launcher_local_ranks(map, 0), InvalidArgument);
  }
}

// A communicator of some of the launcher's processes (a torch.distributed new_group of 2
// of 3 ranks on one host): the launcher's local numbers describe its world, not this group.
TEST(NodeMap, ASubgroupIsNotCheckedAgainstTheLaunchersWorld) {
  const NodeMap pair = NodeMap::from_names({"h", "h"});
  ScopedEnv named("GRADCOMM_NODE", nullptr);
  ScopedEnv local("LOCAL_RANK", "1"), local_size("LOCAL_WORLD_SIZE", "3"), rank("RANK", "1"), world("WORLD_SIZE", "3");
  EXPECT_NO_THROW(check_launcher_local_ranks(pair, 1));  // local rank 1 of 2 here, of 3 for the launcher
  const NodeMap world_map = NodeMap::from_names({"h", "h", "h"});
  EXPECT_NO_THROW(check_launcher_local_ranks(world_map, 1));
  ScopedEnv wrong("LOCAL_WORLD_SIZE", "2");
  EXPECT_THROW(check_launcher_local_ranks(world_map, 1), InvalidArgument);
}

// The in-process tests' communicators get a topology too (CommunicatorImpl's `nodes`).
TEST(NodeMap, CommunicatorReportsItsTopology) {
  const NodeMap map = NodeMap::from_names({"a", "a", "b"});
  auto transports = create_inproc_transports(3);
  std::vector<std::thread> threads;
  std::vector<Topology> seen(3);
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      Communicator comm(std::make_unique<CommunicatorImpl>(std::move(transports[r]), std::chrono::seconds(30),
                                                           nullptr, map));
      seen[r] = comm.topology();
      comm.barrier();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(seen[2].node, 1);
  EXPECT_EQ(seen[2].local_size, 1);
  EXPECT_EQ(seen[1].local_rank, 1);
  EXPECT_EQ(seen[0].node_of_rank, (std::vector<int>{0, 0, 1}));
}

}  // namespace
}  // namespace gradcomm::detail
